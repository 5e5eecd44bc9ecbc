"""Faults that break connections, not processes, for `relstream-lab drill crash` (issue
48): TCP resets of the processes' connections to the broker, and a broker that stops
answering for a while (every request delayed, then answered: a coordinator that answers
slowly, a long GC pause).

A reset is `ss -K` on each connection a process holds to the broker's port (the kernel
sends a RST both ways: the client and the broker each see it broken), as a NAT or load
balancer that drops its state does. A stall is SIGSTOP of the broker's processes, SIGCONT
`stall_s` later: connections stay up, requests wait, and the clients' own timeouts and
the group's session clock run meanwhile. This machine's kernel has no netem (`tc qdisc
... netem` is refused), so a delay is a stall and a drop is a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess

import psutil


def connections_to(pid: int, port: int) -> list[int]:
    """Local ports of the TCP connections process `pid` and its children hold to
    `port` on this host."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    local = []
    for process in processes:
        try:
            found = process.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        local += [c.laddr.port for c in found if c.raddr and c.raddr.port == port]
    return local


def reset(pids: list[int], port: int) -> int:
    """Reset every connection the processes hold to the broker at `port`; how many."""
    count = 0
    for pid in pids:
        for local in connections_to(pid, port):
            done = subprocess.run(
                ["ss", "-K", "dst", "127.0.0.1", "dport", "=", f":{port}",
                 "sport", "=", f":{local}"],
                capture_output=True,
                check=False,
            )  # fmt: skip
            count += done.returncode == 0
    return count


async def reset_rounds(pids, port: int, rounds: int = 3, every_s: float = 1.0) -> int:
    """`rounds` resets `every_s` apart (a flapping link: reconnections broken too)."""
    count = 0
    for round_ in range(rounds):
        if round_:
            await asyncio.sleep(every_s)
        count += await asyncio.to_thread(reset, list(pids()), port)
    return count


def _broker_processes(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


async def stall(broker_pid: int, stall_s: float) -> None:
    """The broker stops answering for `stall_s` seconds (SIGSTOP, then SIGCONT)."""
    processes = _broker_processes(broker_pid)
    for process in processes:
        process.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(stall_s)
    finally:
        for process in processes:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)
