"""The README walkthrough's three processes (broker, worker, engine on `--backend sim`),
started as a user starts them, left idle, and measured: each process's CPU time and bytes
written to disk (its children included) over a spell with no row flowing, then how long
the first row produced after that spell takes to come back as a result. With `rows`, that
many rows go through the pipeline first (produced, answered, the results read back), so
the spell measures a pipeline that has held data, as on day one at scale: the default
broker rewrites its whole store after any write (issue 49).

CPU time, not wall time, is what is measured: on a machine shared with other work a process
that waits is not charged for the waiting, so the share of a core is its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from relstream.kafka.clients.aio import assign_all, new_consumer, produce, running
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import free_port
from relstream.launch import relstream_command, spawn_logged, wait_ready
from relstream.wire import ResultMessage, RowMessage, decode, encode

# The walkthrough's registration (README, "Your own table, step by step").
QUERIES = """\
[[query]]
name = "sentiment"
table = "reviews"
template = "Is this review positive or negative? Answer in one word.\\nReview: {review}"
window_seconds = 2.0
max_rows = 100
max_output_tokens = 5
"""
ROLES = ("broker", "worker", "engine")


@dataclass
class IdleRun:
    broker: str  # "kafka" (the default) or "tansu" (--memory)
    seconds: float  # the idle spell measured
    cpu: dict[str, float]  # role -> share of one core over the spell, children included
    written: dict[str, float]  # role -> MB/s written to disk over the spell, children too
    rows: int  # rows through the pipeline before the spell
    store_mb: float  # the broker's data dir after the spell (0 for --memory)
    first_row_s: float  # a row produced after the spell -> its result read back
    load_before: float  # the machine's 1-minute load average as the spell began
    load_after: float
    # With rows: each round's rows produced -> every one answered, in seconds, and the MB
    # the broker wrote meanwhile; the rows the following JSONL sink stored (and distinct).
    round_s: list[float] = field(default_factory=list)
    round_written_mb: list[float] = field(default_factory=list)
    sink_rows: int = 0
    sink_distinct: int = 0


def _each_process(pid: int, read) -> dict[int, float]:
    """`read(process)` of a process and each of its live descendants, by pid."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    found = {}
    for process in processes:
        try:
            found[process.pid] = float(read(process))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def cpu_seconds(pid: int) -> dict[int, float]:
    """CPU time (user + system) of a process and each of its live descendants, by pid."""
    return _each_process(pid, lambda p: p.cpu_times().user + p.cpu_times().system)


def bytes_written(pid: int) -> dict[int, float]:
    """Bytes written to storage by a process and each of its live descendants, by pid."""
    return _each_process(pid, lambda p: p.io_counters().write_bytes)


def _size_mb(folder: Path) -> float:
    if not folder.exists():
        return 0.0
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


async def _preload(bootstrap: str, rows: range, timeout: float) -> None:
    """`rows` (their numbers) produced to the walkthrough's table, and waited for until a
    result holds each (as a user's reader reads them, from the results' end)."""
    topics = Topics()
    reader = new_consumer(bootstrap)
    async with running(reader):
        partitions = await assign_all(reader, topics.results)
        await reader.seek_to_end(*partitions)
        for partition in partitions:
            await reader.position(partition)
        for start in range(rows.start, rows.stop, 5_000):
            batch = [
                (f"pre-{n}".encode(), encode(RowMessage(
                    table="reviews", key=f"pre-{n}", values={"review": f"Preloaded review {n}."}
                )))
                for n in range(start, min(start + 5_000, rows.stop))
            ]  # fmt: skip
            await produce(bootstrap, topics.rows("reviews"), batch)
        answered, deadline = 0, time.monotonic() + timeout
        while answered < len(rows):
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{answered} of {len(rows)} preloaded rows answered in {timeout:g} s"
                )
            for records in (await reader.getmany(timeout_ms=500)).values():
                answered += sum(len(decode(ResultMessage, r.value).rows) for r in records)


def spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds spent between two `cpu_seconds` readings; a process born meanwhile
    counts whole, one that ended meanwhile counts what it had spent by the first reading
    (not more: no later reading of it exists)."""
    return sum(total - before.get(pid, 0.0) for pid, total in after.items())


def _wait_listening(port: int, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited:\n{log.read_text(errors='replace')[-2000:]}")
        if "ready:" in log.read_text(errors="replace"):
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        time.sleep(0.2)
    raise RuntimeError(f"the broker did not say it was ready within {timeout:g} s")


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM, which every relstream command takes as Ctrl-C (SIGINT would be ignored
    where the benchmark itself runs in the background); killed if still there after 30 s."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _stop_all(processes: list[subprocess.Popen]) -> None:
    """Stop each in turn (`_stop`), then end whatever they started and left behind (the
    broker's own binary, were its command killed before it stopped it)."""
    import psutil

    started = []
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            started += psutil.Process(process.pid).children(recursive=True)
    for process in processes:
        _stop(process)
    for child in started:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    _, alive = psutil.wait_procs(started, timeout=10)
    for child in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


async def _first_row(bootstrap: str, timeout: float) -> float:
    """Seconds from producing one row to reading its result, read as `relstream results
    --follow` reads them (no group: a group's join would be timed too)."""
    topics = Topics()
    row = RowMessage(table="reviews", key="idle-1", values={"review": "Dry after the rain."})
    reader = new_consumer(bootstrap)
    async with running(reader):
        partitions = await assign_all(reader, topics.results)
        await reader.seek_to_end(*partitions)  # past what a preload left there
        for partition in partitions:
            await reader.position(partition)
        started = time.monotonic()
        await produce(bootstrap, topics.rows("reviews"), [(b"idle-1", encode(row))])
        while time.monotonic() - started < timeout:
            if await reader.getmany(timeout_ms=100):
                return time.monotonic() - started
    raise RuntimeError(f"no result within {timeout:g} s")


def _sink_rows(path: Path, want: int, timeout: float) -> tuple[int, int]:
    """The rows the JSONL sink stored (each result's rows) and how many distinct keys,
    read until `want` are there or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while True:
        keys = []
        if path.exists():
            for line in path.read_text().splitlines():
                keys += [row["key"] for row in json.loads(line).get("rows", [])]
        if len(keys) >= want or time.monotonic() > deadline:
            return len(keys), len(set(keys))
        time.sleep(1.0)


def idle_run(
    broker: str, seconds: float, settle: float, workdir: Path, rows: int = 0, rounds: int = 1
) -> IdleRun:
    """One run: the three processes (and, with rows, a following JSONL sink) started,
    ready, `rows` through them in `rounds`, left to settle, then measured."""
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    logs = {role: workdir / f"{role}.log" for role in ROLES}
    (workdir / "queries.toml").write_text(QUERIES)
    broker_command = [sys.executable, "-m", "relstream", "broker", "--port", str(port)]
    broker_command += ["--table", "reviews"]
    broker_command += ["--memory"] if broker == "tansu" else ["--data-dir", str(workdir / "data")]
    processes: dict[str, subprocess.Popen] = {}
    try:
        processes["broker"] = spawn_logged(broker_command, logs["broker"])
        _wait_listening(port, processes["broker"], logs["broker"], 60)
        worker = [*relstream_command(True), "worker", "--bootstrap", bootstrap]
        worker += ["--config", str(workdir / "queries.toml"), "--data-dir", str(workdir / "w")]
        processes["worker"] = spawn_logged(
            [*worker, "--ready-file", str(workdir / "worker.ready")], logs["worker"]
        )
        engine = [sys.executable, "-m", "relstream", "engine", "--backend", "sim"]
        engine += ["--bootstrap", bootstrap, "--policy", "relstream"]
        engine += ["--metrics-port", str(free_port())]
        processes["engine"] = spawn_logged(
            [*engine, "--ready-file", str(workdir / "engine.ready")], logs["engine"]
        )
        ready = [workdir / "worker.ready", workdir / "engine.ready"]
        wait_ready(ready, list(processes.values()), 180)
        round_s, round_mb = [], []
        if rows:
            sink = [sys.executable, "-m", "relstream", "sink", str(workdir / "results.jsonl")]
            processes["sink"] = spawn_logged(
                [*sink, "--bootstrap", bootstrap, "--follow"], workdir / "sink.log"
            )
            each = rows // rounds
            for number in range(rounds):
                began, wrote = time.monotonic(), bytes_written(processes["broker"].pid)
                share = range(number * each, rows if number == rounds - 1 else (number + 1) * each)
                asyncio.run(_preload(bootstrap, share, max(300.0, len(share) / 100)))
                round_s.append(time.monotonic() - began)
                round_mb.append(spent(wrote, bytes_written(processes["broker"].pid)) / 1e6)
        time.sleep(settle)
        load_before = os.getloadavg()[0]
        before = {role: cpu_seconds(p.pid) for role, p in processes.items()}
        wrote = {role: bytes_written(p.pid) for role, p in processes.items()}
        started = time.monotonic()
        time.sleep(seconds)
        after = {role: cpu_seconds(p.pid) for role, p in processes.items()}
        wrote_after = {role: bytes_written(p.pid) for role, p in processes.items()}
        elapsed = time.monotonic() - started
        load_after = os.getloadavg()[0]
        for role, process in processes.items():
            if process.poll() is not None:
                raise RuntimeError(f"the {role} exited while idle; see {logs[role]}")
        cpu = {role: spent(before[role], after[role]) / elapsed for role in ROLES}
        written = {role: spent(wrote[role], wrote_after[role]) / elapsed / 1e6 for role in ROLES}
        store_mb = _size_mb(workdir / "data")
        stored = _sink_rows(workdir / "results.jsonl", rows, 120) if rows else (0, 0)
        first_row = asyncio.run(_first_row(bootstrap, 60))
        return IdleRun(broker, elapsed, cpu, written, rows, store_mb, first_row, load_before,
                       load_after, round_s, round_mb, *stored)  # fmt: skip
    finally:
        order = ("sink", "engine", "worker", "broker")
        _stop_all([processes[role] for role in order if role in processes])


def idle_runs(
    brokers: list[str], runs: int, seconds: float, settle: float, on_run, rows: int = 0,
    rounds: int = 1,
) -> list[dict]:
    """`runs` runs on each broker, alternating, each in a fresh working dir."""
    records = []
    for number in range(runs):
        for broker in brokers:
            with tempfile.TemporaryDirectory(prefix="relstream-idle-") as workdir:
                record = asdict(idle_run(broker, seconds, settle, Path(workdir), rows, rounds))
            record["run"] = number
            on_run(record)
            records.append(record)
    return records
