"""What `relstream-lab drill crash` found: the faults it made and when, what a
`read_committed` reader of the results and dead letters saw, and the verdict.

The reader (`collect`) takes every partition of the results, dead-letter, relQuery and
metrics topics with no group (so it needs no rebalance of its own) and
`isolation_level="read_committed"`: on a broker with transactions it sees only committed
messages, as a sink would. Every result it reads goes to a `JsonlSink` too, which keeps
one result per relQuery id, as `relstream sink` does."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from relstream.connectors.sinks import JsonlSink
from relstream.kafka.clients.aio import assign_all, new_consumer
from relstream.kafka.clients.topics import Topics
from relstream.wire import (
    DeadLetterMessage,
    MetricsMessage,
    RelQueryMessage,
    ResultMessage,
    decode,
)
from relstream_lab.drills.parts import absent, repeated

VISIBLE_WITHIN_S = 30.0  # a result reaches read_committed readers this soon, faults or not


@dataclass
class Fault:
    """One fault and how the pipeline came back from it."""

    at_s: float  # since the rows began
    what: str
    process: str | None = None  # the process started anew (restart or join)
    pid: int | None = None  # the new process's id
    wall: float = 0.0  # time.time() when it started
    ready_s: float | None = None  # start -> its ready file (it took work again)
    watched_s: float = 0.0  # how long the drill watched for that file
    first_s: float | None = None  # start -> its first result (engine) or relQuery (worker)
    note: str = ""
    started_s: float | None = None  # since the rows began, where it started later than `at_s`

    @property
    def restarts(self) -> bool:
        return self.process is not None


@dataclass
class CrashReport:
    seed: int
    broker: str  # "kafka" or "tansu"
    serve_within_s: float
    faults: list[Fault] = field(default_factory=list)
    rows_keys: set[str] = field(default_factory=set, repr=False)  # valid rows acknowledged
    bad_keys: set[str] = field(default_factory=set, repr=False)  # acknowledged, no column
    seen: Counter[str] = field(default_factory=Counter)  # row key -> results rows + letters
    stored: Counter[str] = field(default_factory=Counter)  # row key -> sink's stored results
    result_messages: int = 0
    result_parts: Counter[tuple[str, int]] = field(default_factory=Counter)  # (id, part) -> n
    relquery_ids: dict[str, int] = field(default_factory=dict)  # on the topic -> partition
    lettered_ids: set[str] = field(default_factory=set)  # relQueries dead-lettered
    letter_reasons: dict[str, str] = field(default_factory=dict)  # and why, by id
    first_result: dict[str, float] = field(default_factory=dict)  # engine -> first `at`
    relquery_times: list[float] = field(default_factory=list)  # relQuery records' times
    alive: dict[str, bool] = field(default_factory=dict)  # process -> alive at the end
    pids: list[int] = field(default_factory=list)  # every process the drill started
    exits: dict[str, str] = field(default_factory=dict)  # process -> how it ended, if it did
    left: dict[str, int | None] = field(default_factory=dict)  # process -> its exit code
    windowed: Counter[str] = field(default_factory=Counter)  # row key -> relQueries with it
    waited_s: float = 0.0  # rows stopped -> the reader done
    complete: bool = False  # every row accounted for before the timeout
    # partition -> (last stable offset, end) where a transaction held read_committed
    # readers back when the reader stopped: an open one no producer ends
    unstable: dict[str, tuple[int, int]] = field(default_factory=dict)
    # each result a read_committed reader saw while the drill ran: seconds from its
    # completion (the engine's `completed_at`) to the reader (`watch_visibility`)
    visible_after: list[float] = field(default_factory=list, repr=False)
    error: str = ""

    @property
    def transactions(self) -> bool:
        return self.broker == "kafka"

    @property
    def duplicate_ids(self) -> set[str]:
        return {rid for (rid, _), count in self.result_parts.items() if count > 1}

    @property
    def unanswered(self) -> set[str]:
        answered = {rid for rid, _ in self.result_parts}
        return set(self.relquery_ids) - answered - self.lettered_ids

    def not_once(self) -> dict[str, set[str]]:
        """The rows acknowledged that are not there exactly once: in no result row or
        dead letter, in more than one; in the sink, not stored, stored twice."""
        return {
            "missing": absent(self.rows_keys | self.bad_keys, self.seen),
            "repeated": repeated(self.seen),
            "not stored": absent(self.rows_keys, self.stored),
            "stored twice": repeated(self.stored),
        }

    @property
    def slow(self) -> list[Fault]:
        """Processes started anew that took no work within `serve_within_s` (one that left
        sooner, unready, is not counted)."""
        limit = self.serve_within_s

        def late(fault: Fault) -> bool:
            return fault.ready_s > limit if fault.ready_s is not None else fault.watched_s >= limit

        return [fault for fault in self.faults if fault.restarts and late(fault)]

    def checks(self) -> dict[str, bool]:
        """Each promise and whether it holds. With transactions (Apache Kafka) the reader sees
        exactly one result per relQuery and each row once; without (Tansu) results may
        repeat, and the sink must store each row once."""
        rows = self.not_once()
        checks = {
            "rows produced": bool(self.rows_keys),
            "no error in the drill": not self.error,
            "every process alive at the end": all(self.alive.values()),
            "a leaving engine stops cleanly": all(code == 0 for code in self.left.values()),
            f"every process started anew takes work within {self.serve_within_s:g} s": not (
                self.slow
            ),
            "every bad row dead-lettered": not (self.bad_keys - set(self.seen)),
        }
        if self.visible_after:
            checks[f"every result visible within {VISIBLE_WITHIN_S:g} s of its completion"] = (
                max(self.visible_after) <= VISIBLE_WITHIN_S
            )
        if self.transactions:
            checks |= {
                "one result per relQuery id (read_committed)": not self.duplicate_ids,
                "every relQuery answered or dead-lettered": not self.unanswered,
                "every row in exactly one result row or dead letter": not (
                    rows["missing"] or rows["repeated"]
                ),
            }
        else:
            checks["the sink stores each row once"] = not (
                rows["not stored"] or rows["stored twice"]
            )
        return checks

    @property
    def holds(self) -> bool:
        return all(self.checks().values())


async def collect(
    bootstrap: str,
    broker_kind: str,
    topics: Topics,
    report: CrashReport,
    sink_path: Path,
    timeout: float,
    quiet_s: float = 10.0,
) -> None:
    """Read the four topics from their start, read_committed, until every row is in a
    result or a dead letter and nothing new came for `quiet_s`, or `timeout` passes (then
    the report shows what is missing)."""
    consumer = new_consumer(bootstrap, broker_kind=broker_kind, isolation_level="read_committed")
    sink = JsonlSink(sink_path)
    handlers = {
        topics.results: lambda record: _result(report, sink, record),
        topics.deadletter: lambda record: _letter(report, topics.relqueries, record),
        topics.relqueries: lambda record: _relquery(report, record),
        topics.metrics: lambda record: _metrics(report, record),
    }
    answers = (topics.results, topics.deadletter)  # the metrics topic is never quiet
    started = time.monotonic()
    await consumer.start()
    try:
        await assign_all(consumer, *handlers)
        quiet_since = time.monotonic()
        while time.monotonic() - started < timeout:
            batches = await consumer.getmany(timeout_ms=500)
            for records in batches.values():
                for record in records:
                    handlers[record.topic](record)
            if any(part.topic in answers for part in batches):
                quiet_since = time.monotonic()
            report.complete = not report.not_once()["missing"]
            if report.complete and time.monotonic() - quiet_since > quiet_s:
                break
            await asyncio.sleep(0)
        if not report.complete:
            report.unstable = await _unstable(consumer, bootstrap, broker_kind)
    finally:
        report.waited_s = time.monotonic() - started
        sink.close()
        await consumer.stop()


async def watch_visibility(bootstrap: str, broker_kind: str, topics: Topics, report) -> None:
    """While the drill runs (until cancelled): each result a `read_committed` reader sees,
    how long after its completion. A dead writer's open transaction on a partition other
    writers share would hold their results back until it ends (issue 48, item 2)."""
    consumer = new_consumer(bootstrap, broker_kind=broker_kind, isolation_level="read_committed")
    await consumer.start()
    try:
        await assign_all(consumer, topics.results)
        while True:
            batches = await consumer.getmany(timeout_ms=500)
            now = time.time()
            for records in batches.values():
                for record in records:
                    with contextlib.suppress(Exception):  # another writer's message
                        message = decode(ResultMessage, record.value)
                        report.visible_after.append(max(0.0, now - message.completed_at))
    finally:
        await consumer.stop()


async def _unstable(consumer, bootstrap: str, broker_kind: str) -> dict[str, tuple[int, int]]:
    """The partitions whose last stable offset (a read_committed reader's end) is short of
    their end: an open transaction holds every later message from read_committed readers."""
    parts = sorted(consumer.assignment())
    stable = await consumer.end_offsets(parts)
    uncommitted = new_consumer(
        bootstrap, broker_kind=broker_kind, isolation_level="read_uncommitted"
    )
    await uncommitted.start()
    try:
        ends = await uncommitted.end_offsets(parts)
    finally:
        await uncommitted.stop()
    return {
        f"{part.topic}[{part.partition}]": (stable[part], ends[part])
        for part in parts
        if stable[part] < ends[part]
    }


def _result(report: CrashReport, sink: JsonlSink, record) -> None:
    message = decode(ResultMessage, record.value)
    report.result_messages += 1
    report.result_parts[(message.id, message.part)] += 1
    report.seen.update(row.key for row in message.rows)
    if message.part == 0 and sink.write(message):
        report.stored.update(row.key for row in message.rows)


def _letter(report: CrashReport, relqueries: str, record) -> None:
    letter = decode(DeadLetterMessage, record.value)
    key = (letter.key or b"").decode(errors="replace")
    if letter.topic == relqueries:  # a relQuery: its rows are dead-lettered with it
        report.lettered_ids.add(key)
        report.letter_reasons[key] = letter.reason
        try:
            report.seen.update(row.key for row in decode(RelQueryMessage, letter.original).rows)
        except Exception:  # cut short or not a relQuery: counted by its key
            report.seen[key] += 1
    else:
        report.seen[key] += 1


def _relquery(report: CrashReport, record) -> None:
    report.relquery_ids[(record.key or b"").decode(errors="replace")] = record.partition
    report.relquery_times.append(record.timestamp / 1000)
    with contextlib.suppress(Exception):  # not a whole relQuery: its rows are not counted
        report.windowed.update(row.key for row in decode(RelQueryMessage, record.value).rows)


def _metrics(report: CrashReport, record) -> None:
    try:
        message = decode(MetricsMessage, record.value)
    except Exception:  # a load report
        return
    first = report.first_result.get(message.engine)
    report.first_result[message.engine] = message.at if first is None else min(first, message.at)


def _seconds(value: float | None, limit: float, none: str, since: float) -> str:
    """`value` s after the start, and when that was since the rows began."""
    if value is None:
        return none
    return f"{value:.1f} s{' (over)' if value > limit else ''}, at {since + value:.1f}"


def _visibility(delays: list[float]) -> str:
    if not delays:
        return "- results seen while the drill ran: none"
    ranked = sorted(delays)
    p99 = ranked[min(len(ranked) - 1, int(0.99 * len(ranked)))]
    return (
        f"- results seen by a read_committed reader while the drill ran: {len(ranked)}, "
        f"after their completion: median {ranked[len(ranked) // 2]:.1f} s, p99 {p99:.1f} s, "
        f"max {ranked[-1]:.1f} s"
    )


def _keys(keys: set[str], most: int = 8) -> str:
    return f"{len(keys)} {sorted(keys, key=_order)[:most]}"


def _order(key: str) -> tuple[int, str]:
    number = key.rpartition("-")[2]
    return (int(number), key) if number.isdigit() else (-1, key)


def report_text(report: CrashReport) -> str:
    """The drill's outcome as markdown: the faults, the counts, the checks."""
    limit = report.serve_within_s
    lines = [
        "| at (s) | fault | new pid | took work (its ready file) | first output | note |",
        "| ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for f in report.faults:
        since = f.at_s if f.started_s is None else f.started_s
        ready = _seconds(f.ready_s, limit, f"not in {f.watched_s:.0f} s", since)
        first = _seconds(f.first_s, limit, "none", since)
        ready, first = (ready, first) if f.restarts else ("", "")
        lines.append(f"| {f.at_s:.1f} | {f.what} | {f.pid or ''} | {ready} | {first} | {f.note} |")
    rows, bad = len(report.rows_keys), len(report.bad_keys)
    once = sum(1 for key in report.rows_keys | report.bad_keys if report.seen[key] == 1)
    answered = len({rid for rid, _ in report.result_parts})
    wrong = report.not_once()
    unwindowed = {key for key in wrong["missing"] if key in report.rows_keys}
    unwindowed = {key for key in unwindowed if not report.windowed[key]}
    stalled = Counter(report.relquery_ids[rid] for rid in report.unanswered)
    reader = "read_committed" if report.transactions else "read_committed (no transactions)"
    lines += [
        "",
        f"- rows acknowledged by the broker: {rows} valid and {bad} without the column",
        f"- {reader} reader, {report.waited_s:.0f} s after the rows stopped "
        f"({'every row accounted for' if report.complete else 'timed out with rows missing'}):"
        f" {report.result_messages} result messages for {answered} relQuery ids; "
        f"{len(report.relquery_ids)} relQuery ids published, "
        f"{len(report.lettered_ids)} dead-lettered"
        + "".join(f" ({i}: {why})" for i, why in sorted(report.letter_reasons.items())[:3]),
        f"- relQuery ids with more than one result: {_keys(report.duplicate_ids, 5)}",
        f"- relQueries neither answered nor dead-lettered: {_keys(report.unanswered, 5)}; "
        f"by relQuery partition: {dict(sorted(stalled.items()))}",
        f"- rows in exactly one result row or dead letter: {once}/{rows + bad}; "
        f"missing: {_keys(wrong['missing'])} ({len(unwindowed)} of them in no relQuery); "
        f"in more than one: {_keys(wrong['repeated'])}",
        f"- the sink (one result per id): stored {sum(report.stored.values())} row results; "
        f"rows not stored: {len(wrong['not stored'])}; "
        f"stored twice: {_keys(wrong['stored twice'])}",
        _visibility(report.visible_after),
        "- alive at the end: "
        + ", ".join(f"{name} {'yes' if up else 'NO'}" for name, up in report.alive.items()),
    ]
    lines += [f"  - {name}: {how}" for name, how in report.exits.items()]
    if report.unstable:
        lines.append(
            "- held by a transaction still open (last stable offset, end): "
            + ", ".join(f"{part} {lso}/{end}" for part, (lso, end) in report.unstable.items())
        )
    if report.error:
        lines.append(f"- the drill stopped early: {report.error}")
    lines.append("- checks: " + "; ".join(
        f"{name}: {'yes' if ok else 'NO'}" for name, ok in report.checks().items()
    ))  # fmt: skip
    return "\n".join(lines)
