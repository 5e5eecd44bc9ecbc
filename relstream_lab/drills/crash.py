"""`relstream-lab drill crash`: processes SIGKILLed and restarted, a rebalance and a broker
restart while rows flow; each row is answered once.

Two engines (sim backend in real time, one group) and a worker (real processes) serve a
stream of rows at a steady seeded rate, one in 25 of them without the template's column.
At seeded times while the rows flow: each engine is SIGKILLed and started again with the
same command, a third engine joins the group and later leaves it (SIGTERM), the worker is
SIGKILLed and started again with the same command, and the broker (Apache Kafka, on
disk) is stopped (SIGTERM, its controlled shutdown) and started again on its port and
data dir (the `--memory` broker, Tansu, keeps nothing over a restart, so that fault is
left out there). With
`network` (the default) the connections break too (`netfaults`): every process's broker
connections reset three times, the broker stalled (SIGSTOP) for `stall_s`, and a fourth
engine joining during such a stall, so partitions are revoked with commits in flight;
engine-b, SIGKILLed, stays dead `dead_s` (35 s) before it starts again, its open
transaction left behind; and a `read_committed` reader times each result's arrival after
its completion (every one within 30 s: the others' results are not held back). Once the
rows stop, a `read_committed` reader (`crash_report.collect`) checks what issue 39 asks:
one result per relQuery id, every row acknowledged by the broker in exactly one result
row or dead letter (without transactions, on Tansu: a sink that keeps one result per id
stores each row once), every process alive, and each process started anew taking work
(its ready file) within `serve_within` seconds; it also times each one's first output.
Every process the drill starts is stopped at its end, whatever happened; each wait is
bounded. `tests/lab/test_drill_crash.py` runs a short one.
"""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from relstream.kafka.clients.aio import metadata_ok
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.publish import quiet_outages
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.launch import relstream_command, spawn_logged, start_worker, wait_ready
from relstream_lab.drills import netfaults
from relstream_lab.drills.crash_report import CrashReport, Fault, collect, watch_visibility
from relstream_lab.drills.parts import (
    TABLE,
    Rows,
    engine_command,
    query_config,
    start_kafka,
    stop_kafka,
)

ENGINES = ("engine-a", "engine-b")
JOINER = "engine-c"  # joins the group mid-stream, leaves it later
REVOKER = "engine-d"  # joins while the broker stalls: partitions revoked mid-commit
STOP_S = 30.0  # how long a process is given to stop after SIGTERM


class Fleet:
    """The drill's processes by name, each with its log and ready file in `workdir`; a
    restarted process gets the very command it was started with. Every process it ever
    started is stopped by `stop_all`."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.current: dict[str, subprocess.Popen] = {}
        self.every: list[subprocess.Popen] = []

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    def ready(self, name: str) -> Path:
        return self.workdir / f"{name}.ready"

    def track(self, name: str, process: subprocess.Popen) -> subprocess.Popen:
        self.current[name] = process
        self.every.append(process)
        return process

    def start(self, name: str, command: list[str]) -> subprocess.Popen:
        # A SIGKILLed process leaves its ready file: removed, so a new one means ready.
        self.ready(name).unlink(missing_ok=True)
        return self.track(name, spawn_logged(command, self.log(name)))

    def kill_and_restart(self, name: str) -> subprocess.Popen:
        return self.start(name, self.kill(name))

    def kill(self, name: str) -> list[str]:
        """SIGKILL the process; its command, to start it again with."""
        old = self.current[name]
        old.kill()
        old.wait(STOP_S)
        return list(old.args)

    def leave(self, name: str) -> tuple[int | None, bool]:
        """SIGTERM, and the exit code (None: still running after `STOP_S`), and whether
        it had exited before."""
        process = self.current.pop(name)
        if process.poll() is not None:
            return process.returncode, True
        process.terminate()
        try:
            return process.wait(STOP_S), False
        except subprocess.TimeoutExpired:
            return None, False

    def alive(self) -> dict[str, bool]:
        return {name: process.poll() is None for name, process in self.current.items()}

    def exits(self) -> dict[str, str]:
        """Each process that should run but has exited: its code and last error line."""
        return {
            name: f"exit code {process.returncode}: {_last_error(self.log(name))}"
            for name, process in self.current.items()
            if process.poll() is not None
        }

    def stop_all(self) -> None:
        for process in self.every:
            if process.poll() is None:
                process.terminate()
        for process in self.every:
            try:
                process.wait(STOP_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def plan(
    rng: random.Random, duration: float, broker_restart: bool, network: bool = True
) -> list[tuple[float, str]]:
    """The faults in a seeded order, the joiner's leaving last (so it has time to take
    work first), one in each of equal slots over the middle of the stream, at a seeded
    point of its first half."""
    faults = ["kill engine-a", "kill engine-b", "join", "kill worker"]
    if broker_restart:
        faults.append("broker")
    if network:
        faults += ["resets", "stall", "revoke"]
    rng.shuffle(faults)
    faults.append("leave")
    start, slot = 0.1 * duration, 0.75 * duration / len(faults)
    return [(start + i * slot + rng.uniform(0, slot / 2), f) for i, f in enumerate(faults)]


@dataclass(frozen=True)
class Settings:
    """How long and how hard one run goes (the command's options)."""

    memory: bool = False  # on Tansu: no transactions, no broker restart
    duration: float = 60.0  # seconds the rows flow
    rate: float = 20.0  # rows per second
    broker_down: float = 5.0  # seconds
    bad_every: int = 25  # one row in this many lacks the template's column
    timeout: float = 120.0  # seconds for each wait: start-up, acknowledgements, results
    serve_within: float = 30.0  # seconds a process started anew may take to take work
    engine_args: tuple[str, ...] = ()  # added to every engine's command
    network: bool = True  # connection resets, broker stalls, a revocation mid-commit
    stall_s: float = 3.0  # seconds the broker answers nothing, in a stall
    # With `network`, engine-b stays dead this long after its SIGKILL (its open
    # transaction left to stall whatever it wrote): the others' results must reach a
    # read_committed reader meanwhile
    dead_s: float = 35.0


def run_crash(workdir: Path, seed: int = 0, settings: Settings = Settings()) -> CrashReport:
    """The drill on its own broker (data and logs in `workdir`): Apache Kafka on disk, or
    Tansu with `settings.memory`."""
    memory, timeout = settings.memory, settings.timeout
    kind = "tansu" if memory else "kafka"
    topics = Topics(prefix=f"crash{seed}.")
    broker = EmbeddedBroker(kind, data_dir=workdir / "broker", topics=topics, tables=(TABLE,))
    config = workdir / "queries.toml"
    config.write_text(query_config("crash"))
    report = CrashReport(seed, kind, settings.serve_within)
    fleet = Fleet(workdir)

    def engine(name: str) -> list[str]:
        return engine_command(broker, topics, fleet.ready(name), *settings.engine_args)

    quiet_outages()  # this process's producer and reader retry too
    broker.start()
    try:
        # One at a time: two engines joining a new group at once could get an empty
        # assignment on the broker this drill first ran on (docs/drills/crash.md).
        for name in ENGINES:
            fleet.start(name, engine(name))
            wait_ready([fleet.ready(name)], [fleet.current[name]], timeout)
        worker = start_worker(
            relstream_command(True), broker, config, fleet.log("worker"), topics,
            ready_file=fleet.ready("worker"),
        )  # fmt: skip
        fleet.track("worker", worker)
        wait_ready([fleet.ready("worker")], list(fleet.current.values()), timeout)
        faults = plan(
            random.Random(f"faults {seed}"), settings.duration, not memory, settings.network
        )
        drill = _Drill(broker, topics, fleet, report, engine, settings)
        asyncio.run(drill.run(random.Random(seed), faults))
    except Exception as exc:  # the report says what stopped the drill
        report.error = f"{type(exc).__name__}: {exc}"
    finally:
        report.alive, report.exits = fleet.alive(), fleet.exits()
        fleet.stop_all()
        report.pids = [process.pid for process in fleet.every]
        broker.stop()
    _first_outputs(report)
    return report


class _Drill:
    def __init__(self, broker, topics, fleet, report, engine, settings: Settings) -> None:
        self.broker, self.topics, self.fleet, self.report = broker, topics, fleet, report
        self.engine, self.settings = engine, settings
        self.watchers: dict[str, asyncio.Task] = {}  # process -> its ready file watched
        self.later: list[asyncio.Task] = []  # processes to start again after a while

    async def run(self, rng: random.Random, faults: list[tuple[float, str]]) -> None:
        settings, timeout = self.settings, self.settings.timeout
        rows = Rows(self.broker, self.topics.rows(TABLE), rng, settings.bad_every)
        try:
            await rows.producer.start()
            began = time.monotonic()
            watching = asyncio.create_task(
                watch_visibility(self.broker.bootstrap, self.broker.kind, self.topics,
                                 self.report)
            )  # fmt: skip
            async with asyncio.TaskGroup() as group:
                group.create_task(rows.stream(settings.rate, settings.duration))
                group.create_task(self._faults(faults, began))
            await asyncio.gather(*self.later)  # a process still dead is started again
            await rows.settle(timeout)
            self.report.rows_keys, self.report.bad_keys = rows.acked, rows.bad_acked
            await collect(
                self.broker.bootstrap, self.broker.kind, self.topics, self.report,
                self.fleet.workdir / "results.jsonl", timeout,
            )  # fmt: skip
            watching.cancel()
        finally:
            self.report.rows_keys, self.report.bad_keys = rows.acked, rows.bad_acked
            for watcher in self.watchers.values():
                watcher.cancel()
            await rows.producer.stop()

    async def _faults(self, faults: list[tuple[float, str]], began: float) -> None:
        for at, kind in faults:
            await asyncio.sleep(max(0.0, began + at - time.monotonic()))
            fault = Fault(at_s=time.monotonic() - began, what=kind)
            self.report.faults.append(fault)
            if kind.startswith("kill ") and self.settings.network and kind.endswith("-b"):
                name, dead_s = kind.removeprefix("kill "), self.settings.dead_s
                fault.what = f"SIGKILL {name}, started again {dead_s:g} s later"
                command = await asyncio.to_thread(self.fleet.kill, name)
                restart = self._later(fault, name, command, began)
                self.later.append(asyncio.create_task(restart))
            elif kind.startswith("kill "):
                name = kind.removeprefix("kill ")
                fault.what = f"SIGKILL {name}, started again with the same command"
                self._started(
                    fault, name, await asyncio.to_thread(self.fleet.kill_and_restart, name)
                )
            elif kind == "join":
                fault.what = f"{JOINER} joins the group"
                self._started(fault, JOINER, self.fleet.start(JOINER, self.engine(JOINER)))
            elif kind == "leave":
                fault.what = f"{JOINER} leaves (SIGTERM)"
                waited = await self._until_served(JOINER)
                fault.at_s = time.monotonic() - began
                if waited >= 0.5:
                    fault.note = f"after waiting {waited:.1f} s for it to take work; "
                code, before = await asyncio.to_thread(self.fleet.leave, JOINER)
                self.report.left[JOINER] = None if before else code
                took = time.monotonic() - began - fault.at_s
                fault.note += (
                    f"had exited already, code {code}: {_last_error(self.fleet.log(JOINER))}"
                    if before
                    else f"exit code {code} after {took:.1f} s"
                    if code is not None
                    else f"still running after {STOP_S:g} s"
                )
            elif kind in ("resets", "stall", "revoke"):
                await self._network(fault, kind)
            else:
                fault.what = "broker stopped (SIGTERM) and started again on its data"
                await stop_kafka(self.broker)
                stopped = time.monotonic()
                await asyncio.sleep(self.settings.broker_down)
                await start_kafka(self.broker)
                fault.note = f"down {time.monotonic() - stopped:.1f} s"

    async def _later(self, fault: Fault, name: str, command: list[str], began: float) -> None:
        """Start `name` again `dead_s` after its kill, with the same command, once the
        broker answers, as a supervisor would: an engine that finds its broker out gives
        up after `BROKER_CHECK_S` (a wrong address is said at once), and one that exits so
        is started again (three times at most)."""
        await asyncio.sleep(self.settings.dead_s)
        waited = time.monotonic()
        for _start in range(3):
            await self._broker_answers()
            if _start == 0 and (took := time.monotonic() - waited) > 1.0:
                fault.note = f"after {took:.1f} s more for the broker to answer"
            fault.started_s = time.monotonic() - began
            process = self.fleet.start(name, command)
            self._started(fault, name, process)
            deadline = time.monotonic() + self.settings.serve_within
            while process.poll() is None and not self.fleet.ready(name).exists():
                if time.monotonic() > deadline:
                    return
                await asyncio.sleep(0.2)
            if process.poll() is None:
                return
            fault.note += f"; exited ({_last_error(self.fleet.log(name))[:80]}), started again"

    async def _broker_answers(self) -> None:
        """Until the broker answers a metadata request (neither down nor stalled)."""
        while True:
            try:
                async with asyncio.timeout(2.0):
                    await metadata_ok(self.broker.bootstrap)
                return
            except Exception:  # down or stalled
                await asyncio.sleep(0.5)

    async def _network(self, fault: Fault, kind: str) -> None:
        """A fault of the connections (`netfaults`): resets of every process's, a stall
        of the broker, or a stall during which an engine joins, so the group revokes
        partitions whose commits wait on the stalled broker."""
        port, stall_s = self.broker.port, self.settings.stall_s
        if kind == "resets":
            fault.what = "TCP resets (ss -K) of every process's broker connections, 3 rounds"
            pids = lambda: [p.pid for p in self.fleet.current.values()]  # noqa: E731
            fault.note = f"{await netfaults.reset_rounds(pids, port)} connections reset"
        elif kind == "stall":
            fault.what = f"broker stalled (SIGSTOP) {stall_s:g} s: every request delayed"
            await netfaults.stall(self.broker.pid, stall_s)
        else:
            fault.what = f"{REVOKER} joins while the broker is stalled {stall_s:g} s"
            stalled = asyncio.create_task(netfaults.stall(self.broker.pid, stall_s))
            await asyncio.sleep(min(0.5, stall_s / 2))  # commits in flight wait on it
            self._started(fault, REVOKER, self.fleet.start(REVOKER, self.engine(REVOKER)))
            await stalled

    async def _until_served(self, name: str) -> float:
        """Seconds waited for `name` to take work, or exit, or for `serve_within` (and a
        little) from its start to pass, so that it leaves a group it is in; from then it
        is no longer watched."""
        watcher, process = self.watchers.pop(name), self.fleet.current[name]
        fault = next(f for f in reversed(self.report.faults) if f.pid == process.pid)
        deadline, started = fault.wall + self.report.serve_within_s + 0.5, time.monotonic()
        while not watcher.done() and process.poll() is None and time.time() < deadline:
            await asyncio.sleep(0.1)
        watcher.cancel()
        return time.monotonic() - started

    def _started(self, fault: Fault, name: str, process: subprocess.Popen) -> None:
        fault.process, fault.pid, fault.wall = name, process.pid, time.time()
        self.watchers[name] = asyncio.create_task(_watch(fault, self.fleet.ready(name)))


async def _watch(fault: Fault, ready: Path) -> None:
    """Sets the fault's `ready_s` once the new process has written its ready file, and
    `watched_s` to how long it was waited for (until then, or until cancelled)."""
    started = time.monotonic()
    try:
        while not ready.exists():
            await asyncio.sleep(0.1)
        fault.ready_s = time.monotonic() - started
    finally:
        fault.watched_s = time.monotonic() - started


def _last_error(log: Path) -> str:
    """The last line of a process's log that says `Error`, else its last line."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line]
    return (errors or lines or ["(empty log)"])[-1][:300]


def _first_outputs(report: CrashReport) -> None:
    """Each new process's first output after its start: an engine's first result (its
    metrics message names it by host and process id), the worker's first relQuery."""
    host = socket.gethostname()
    for fault in report.faults:
        if fault.process == "worker":
            after = [t for t in report.relquery_times if t >= fault.wall]
            fault.first_s = min(after) - fault.wall if after else None
        elif fault.process is not None:
            first = report.first_result.get(f"{host}:{fault.pid}")
            fault.first_s = first - fault.wall if first is not None else None
