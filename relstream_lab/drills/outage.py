"""`relstream-lab drill outage`: the broker goes away mid-stream and comes back; nothing is lost.

A worker and an engine (real processes, sim backend) serve a stream of rows on an Apache Kafka
broker that keeps its data on disk. Mid-stream, right after a burst (so the engine is
serving when it happens), the broker is stopped: the results and dead-letter topics, and
every other, cannot be written. It starts again on the same port and data directory after
`outage_s`, while rows keep arriving (their producer holds them until the broker takes
them). The broker is stopped by SIGTERM (Kafka's controlled shutdown, which syncs its
logs to disk before it exits). The drill then checks what docs/operations.md promises:
every row the broker acknowledged is in exactly one stored result (a `JsonlSink`, which
keeps one result per relQuery id), every bad row is dead-lettered, both processes are
alive, and the engine's log shows the pause and the resume. It also counts the log lines
each process wrote during the outage.
`tests/kafka/test_outage.py` runs a short one.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from relstream.connectors.sinks import JsonlSink
from relstream.kafka.clients.aio import Subscription
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.publish import quiet_outages
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.launch import relstream_command, spawn_logged, start_worker, wait_ready
from relstream.wire import DeadLetterMessage, ResultMessage, decode
from relstream_lab.drills.parts import (
    TABLE,
    Rows,
    absent,
    engine_command,
    query_config,
    read_all,
    repeated,
    start_kafka,
    stop_kafka,
)

ENGINE_PAUSE = "pausing relqueries partition"
ENGINE_RESUME = "resuming relqueries partition"


@dataclass
class OutageReport:
    seed: int
    down_s: float = 0.0  # broker stopped → started again and answering
    rows_produced: int = 0  # acknowledged by the broker, valid ones
    bad_produced: int = 0  # acknowledged, without the template's column
    rows_during_outage: int = 0  # produced (given to the producer) while it was down
    stored: Counter[str] = field(default_factory=Counter)  # row key -> stored results with it
    results_stored: int = 0  # distinct relQuery ids in the sink
    results_published: int = 0  # result messages on the topic (replays included)
    lettered: set[str] = field(default_factory=set)  # bad row keys dead-lettered
    alive: dict[str, bool] = field(default_factory=dict)
    logs: dict[str, list[str]] = field(default_factory=dict)  # process -> pause/resume lines
    outage_lines: dict[str, int] = field(default_factory=dict)  # process -> not INFO, while down
    rows_keys: set[str] = field(default_factory=set, repr=False)
    bad_keys: set[str] = field(default_factory=set, repr=False)

    @property
    def missing(self) -> set[str]:
        return absent(self.rows_keys, self.stored)

    @property
    def repeated(self) -> set[str]:
        return repeated(self.stored)

    @property
    def paused_and_resumed(self) -> bool:
        lines = "\n".join(self.logs.get("engine", []))
        return ENGINE_PAUSE in lines and ENGINE_RESUME in lines

    @property
    def holds(self) -> bool:
        return (
            self.rows_produced > 0
            and not self.missing
            and not self.repeated
            and set(self.stored) <= self.rows_keys
            and self.bad_keys <= self.lettered
            and all(self.alive.values())
            and self.paused_and_resumed
        )


def _lines(path: Path) -> int:
    """Lines of a process's log that are not INFO (warnings, errors, tracebacks)."""
    if not path.exists():
        return 0
    return sum(" INFO " not in line for line in path.read_text(errors="replace").splitlines())


def run_outage(
    workdir: Path,
    seed: int = 0,
    outage_s: float = 60.0,
    rate: float = 20.0,
    before_s: float = 15.0,
    after_s: float = 15.0,
    burst: int = 2000,
    bad_every: int = 25,
    timeout: float = 300.0,
) -> OutageReport:
    """The drill on its own Apache Kafka broker (data and logs in `workdir`)."""
    topics = Topics(prefix=f"outage{seed}.")
    # An explicit data dir: it keeps its topics across the restart.
    broker = EmbeddedBroker("kafka", data_dir=workdir / "broker", topics=topics, tables=(TABLE,))
    config = workdir / "queries.toml"
    config.write_text(query_config("outage"))
    logs = {"engine": workdir / "engine.log", "worker": workdir / "worker.log"}
    report = OutageReport(seed)
    quiet_outages()  # this process's producer and readers retry too
    broker.start()
    try:
        engine = spawn_logged(
            engine_command(broker, topics, workdir / "engine.ready"), logs["engine"]
        )
        worker = start_worker(
            relstream_command(True), broker, config, logs["worker"], topics,
            ready_file=workdir / "worker.ready",
        )  # fmt: skip
        try:
            ready_files = [workdir / "worker.ready", workdir / "engine.ready"]
            wait_ready(ready_files, (engine, worker), timeout)
            asyncio.run(
                _stream(broker, topics, report, random.Random(seed), logs, workdir,
                        outage_s, rate, before_s, after_s, burst, bad_every, timeout)
            )  # fmt: skip
        finally:
            report.alive = {"engine": engine.poll() is None, "worker": worker.poll() is None}
            for process in (engine, worker):
                process.terminate()
            for process in (engine, worker):
                process.wait(30)
    finally:
        broker.stop()
    for name, path in logs.items():
        text = path.read_text(errors="replace").splitlines()
        report.logs[name] = [line for line in text if "pausing" in line or "resuming" in line]
    return report


async def _stream(broker, topics, report, rng, logs, workdir, outage_s, rate, before_s,
                  after_s, burst, bad_every, timeout) -> None:  # fmt: skip
    rows = Rows(broker, topics.rows(TABLE), rng, bad_every)
    await rows.producer.start()
    try:
        await rows.stream(rate, before_s + rng.uniform(0, 5))
        rows.emit(burst)  # the engine is serving these when the broker goes
        await rows.settle(timeout)
        await asyncio.sleep(rng.uniform(0.5, 1.5))
        lines = {name: _lines(path) for name, path in logs.items()}
        await stop_kafka(broker)
        stopped, sent = time.monotonic(), rows.sent
        await rows.stream(rate, outage_s)
        await start_kafka(broker)
        report.down_s = time.monotonic() - stopped
        report.rows_during_outage = rows.sent - sent
        report.outage_lines = {name: _lines(path) - lines[name] for name, path in logs.items()}
        await rows.stream(rate, after_s)
        await rows.settle(timeout)
    finally:
        await rows.producer.stop()
    report.rows_keys, report.bad_keys = rows.acked, rows.bad_acked
    report.rows_produced, report.bad_produced = len(rows.acked), len(rows.bad_acked)
    await _collect(broker, topics, report, workdir / "results.jsonl", timeout)


async def _collect(broker, topics: Topics, report: OutageReport, sink_path: Path, timeout):
    """Store the results in a sink as `relstream sink` would (one per id) and read the
    dead letters, until every row is in and the topics have been idle for 10 s, or
    `timeout` passes (then the report shows what is missing)."""
    sink = JsonlSink(sink_path)
    deadline = time.monotonic() + timeout

    def stored(record) -> None:
        message = decode(ResultMessage, record.value)
        report.results_published += 1
        if sink.write(message):
            report.results_stored += 1
            report.stored.update(row.key for row in message.rows)

    def lettered(record) -> None:
        report.lettered.add((decode(DeadLetterMessage, record.value).key or b"").decode())

    try:
        async with (
            Subscription(broker.bootstrap, topics.results, broker_kind=broker.kind) as results,
            Subscription(broker.bootstrap, topics.deadletter, broker_kind=broker.kind) as letters,
        ):
            tasks = [
                asyncio.create_task(read_all(results, stored)),
                asyncio.create_task(read_all(letters, lettered)),
            ]
            try:
                quiet_since = time.monotonic()
                seen = -1
                while time.monotonic() < deadline:
                    await asyncio.sleep(0.5)
                    count = report.results_published + len(report.lettered)
                    if count != seen:
                        seen, quiet_since = count, time.monotonic()
                    complete = not report.missing and report.bad_keys <= report.lettered
                    if complete and time.monotonic() - quiet_since > 10:
                        break
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        sink.close()


def report_text(report: OutageReport) -> str:
    """The drill's outcome as markdown lines."""
    missing, repeated = sorted(report.missing), sorted(report.repeated)
    lost_letters = sorted(report.bad_keys - report.lettered)
    lines = [
        f"- broker down {report.down_s:.1f} s (SIGTERM, then started again on "
        "the same data dir and port); "
        f"rows produced: {report.rows_produced} valid and {report.bad_produced} without the "
        f"column, {report.rows_during_outage} of them while the broker was down",
        f"- stored results: {report.results_stored} (result messages on the topic: "
        f"{report.results_published}); rows in exactly one stored result: "
        f"{sum(1 for key in report.rows_keys if report.stored[key] == 1)}/{report.rows_produced}"
        f"; missing: {len(missing)} {missing[:5]}; in more than one: {len(repeated)} "
        f"{repeated[:5]}",
        f"- rows without the column dead-lettered: "
        f"{len(report.bad_keys & report.lettered)}/{report.bad_produced}; not: "
        f"{len(lost_letters)} {lost_letters[:5]}",
        "- alive at the end: "
        + ", ".join(f"{name} {'yes' if up else 'NO'}" for name, up in report.alive.items()),
        "- log lines other than INFO written while the broker was down: "
        + ", ".join(f"{name} {count}" for name, count in report.outage_lines.items()),
    ]
    for name, found in report.logs.items():
        lines.append(f"- {name}'s pause and resume lines ({len(found)}):")
        lines += [f"  - `{line.strip()}`" for line in found[:6]]
        if len(found) > 6:
            lines.append(f"  - … and {len(found) - 6} more")
    return "\n".join(lines)
