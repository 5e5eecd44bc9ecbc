"""What `relstream status` shows of a pipeline, read from its broker alone: each topic's
size, each consumer group's lag by topic (what `kafka-consumer-groups --describe` gives),
the engines seen answering, and the dead letters by cause.

Every number is taken against one set of ends, found at the start (`bounds.extents`,
which finds the true end where a broker's listed end is short, as Tansu's is), and each
tail is read up to those ends and no further, within a deadline: a live pipeline never
goes quiet, so reading "until idle" never returns. No consumer group is joined.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

from relstream.kafka.clients.bounds import Extent, Span, count_records, extents, partitions
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.sync import sync_admin, sync_consumer
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.groups import (
    COUNTED,
    GroupLag,
    group_lag,
    group_names,
    member_counts,
)
from relstream.wire import DeadLetterMessage, LoadReportMessage, MessageError, MetricsMessage
from relstream.wire.formats import decode_record, is_load_report

M = TypeVar("M", DeadLetterMessage, MetricsMessage, LoadReportMessage)
TAIL_MESSAGES = 10_000  # the newest metrics and dead letters read, per partition
STATUS_S = 8.0  # status answers within this (plus the interpreter's start)
EXAMPLES = 3  # example keys shown per dead-letter cause
# An engine at work reports its load every LOAD_REPORT_S: silent this long, it is stopped
# or dead (`relstream status` marks it stale). An idle one reports only every
# LOAD_HEARTBEAT_S: stale after `placement.choice.IDLE_EXPIRY_S`.
STALE_REPORT_S = 30.0
HELD_LOOK_S = 1.5  # a partition held this long at one offset is named held
PROBE_S = 1.0  # an engine's metrics endpoint not answering in this long: not known
PROBES = 16  # engines probed at once


@dataclass(frozen=True)
class TopicSize:
    name: str
    partitions: int
    messages: int  # records a reader finds, over its partitions (`counted`), else offsets
    replication: int | None = None  # replicas per partition (the fewest); None: not told
    under_replicated: tuple[int, ...] = ()  # partitions with fewer in sync than replicas
    counted: bool = True  # False: some partition's offsets stand for its records (at most)


@dataclass(frozen=True)
class HeldPartition:
    """A partition an open transaction holds: `read_committed` readers wait at `since`."""

    topic: str
    partition: int
    since: int  # its last stable offset
    offsets: int  # offsets written behind it (records and markers)


@dataclass(frozen=True)
class EngineSeen:
    name: str  # host:pid
    answered: int  # relQueries answered among the metrics read
    last_answer_at: float | None  # wall time of its newest answer (None: none read)
    outstanding_s: float | None = None  # the work its newest load report left it
    reported_at: float | None = None  # wall time of that report (None: none read)
    listens: str | None = None  # where that report says it listens while it runs
    # whether something listens there now: False, refused (stopped or killed); None, not
    # known (no address, another machine's loopback, or no answer within PROBE_S)
    listening: bool | None = None


@dataclass
class DeadLetterCauses:
    """Dead letters counted by cause (the reason without its row key, ids and numbers),
    with the keys of the first few letters of each cause."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, letter: DeadLetterMessage) -> None:
        cause = reason_kind(letter.reason)
        self.counts[cause] += 1
        shown = self.examples.setdefault(cause, [])
        if len(shown) < EXAMPLES:
            shown.append(example_key(letter))

    def total(self) -> int:
        return sum(self.counts.values())

    def lines(self) -> list[str]:
        """One line a cause, the commonest first: count, cause and example keys."""
        return [
            f"{n} × {cause} (e.g. {', '.join(self.examples[cause])})"
            for cause, n in self.counts.most_common()
        ]


@dataclass(frozen=True)
class PipelineStatus:
    topics: list[TopicSize]
    groups: list[GroupLag]
    engines: list[EngineSeen]
    dead_letters: DeadLetterCauses
    unread: list[str] = field(default_factory=list)  # tails not read to their end in time
    cut: list[str] = field(default_factory=list)  # tails that began after the log start
    held: list[HeldPartition] = field(default_factory=list)


_NAMED = re.compile(r"""\b(row|relQuery|key|id)\s+('[^']*'|"[^"]*"|\S+)""")
_INDEX = re.compile(r"\[\d+\]")
# A number standing alone: not the digits of a name such as UTF-8, int64 or x2.
_NUMBER = re.compile(r"(?<![A-Za-z]-)(?<![\w])\d[\d,._]*")


def reason_kind(reason: str) -> str:
    """A dead letter's cause: its reason with the row key or relQuery id named in it, list
    indices and numbers taken out, so letters of one cause count together."""
    cause = _NAMED.sub(lambda m: f"{m.group(1)} …", reason)
    return _NUMBER.sub("N", _INDEX.sub("[…]", cause)).strip()


def example_key(letter: DeadLetterMessage) -> str:
    """What names a dead letter to its sender: its key, or where it was read."""
    if letter.key:
        return letter.key.decode("utf-8", "backslashreplace")
    return f"{letter.topic}[{letter.partition}]@{letter.offset}"


def pipeline_status(
    bootstrap: str, topics: Topics, security: KafkaSecurity = PLAINTEXT, within: float = STATUS_S
) -> PipelineStatus:
    deadline = time.monotonic() + within
    admin = sync_admin(bootstrap, security)
    consumer = sync_consumer(bootstrap, security=security, enable_auto_commit=False)
    try:
        names = sorted(n for n in admin.list_topics() if n.startswith(topics.prefix))
        parts = partitions(consumer, names)
        found = extents(consumer, parts, highwaters=_highwaters(bootstrap, security, parts))
        sizes = _sizes(consumer, names, found, replication(admin, names), deadline)
        lags = [
            group_lag(admin, consumer, group, topics, found, deadline)
            for group in group_names(admin)
        ]
        lags = [lag for lag in lags if lag.lag]
        members = member_counts(admin, [lag.group for lag in lags])
        groups = [GroupLag(g.group, g.stage, g.lag, members.get(g.group)) for g in lags]
        metrics = _tail(consumer, found, topics.metrics, deadline)
        records = list(metrics)  # at most TAIL_MESSAGES: metrics and load reports
        reports = [record for record in records if is_load_report(record.headers)]
        answers = [record for record in records if not is_load_report(record.headers)]
        engines = _engines(_decoded(MetricsMessage, answers), _decoded(LoadReportMessage, reports))
        letters = _tail(consumer, found, topics.deadletter, deadline)
        causes = DeadLetterCauses()
        for letter in _decoded(DeadLetterMessage, letters):
            causes.add(letter)
        unread = sorted({p.topic for span in (metrics, letters) for p in span.unread})
        cut = sorted(
            {p.topic for span in (metrics, letters) for p in span.bounds if _cut(found[p])}
        )
        held = [
            HeldPartition(p.topic, p.partition, e.held_from, e.end - e.held_from)
            for p, e in sorted(_stuck(consumer, found).items())
        ]
    finally:
        consumer.close()
        admin.close()
    return PipelineStatus(sizes, groups, engines, causes, unread, cut, held)


def _sizes(
    consumer, names: list[str], found: dict[object, Extent], replicas: dict, deadline: float
) -> list[TopicSize]:
    """Each topic's records a reader finds now (up to an open transaction), counted where
    a partition holds at most COUNTED offsets and is read in time (transaction markers
    take offsets: one relQuery answered exactly once is 2), else its offsets (`counted`
    False: at most that many)."""
    visible = {p: (e.start, e.stable) for p, e in found.items() if e.stable > e.start}
    spans = {p: span for p, span in visible.items() if span[1] - span[0] <= COUNTED}
    records = count_records(consumer, spans, deadline)
    # A partition not counted: its offsets up to an open transaction, at most its records.
    sizes = {p: records.get(p, end - start) for p, (start, end) in visible.items()}
    return [
        TopicSize(
            name,
            sum(p.topic == name for p in found),
            sum(n for p, n in sizes.items() if p.topic == name),
            *replicas.get(name, (None, ())),
            counted=all(p in records for p in visible if p.topic == name),
        )
        for name in names
    ]


def replication(admin, names: list[str]) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Per topic: its replicas per partition (the fewest) and the partitions whose in-sync
    replicas are fewer than their replicas; empty where the broker would not describe them."""
    try:
        described = admin.describe_topics(names) if names else []
    except Exception:  # a broker without DescribeTopics: not told
        return {}
    found = {}
    for topic in described:
        parts = topic.get("partitions") or []
        if topic.get("error_code") or not parts:
            continue
        under = tuple(
            sorted(
                p["partition_index"] for p in parts if len(p["isr_nodes"]) < len(p["replica_nodes"])
            )
        )
        found[topic["name"]] = (min(len(p["replica_nodes"]) for p in parts), under)
    return found


def _stuck(consumer, found: dict) -> dict:
    """The partitions held by an open transaction that are still held, at the same last
    stable offset, `HELD_LOOK_S` later: on a live exactly-once pipeline some transaction is
    open at any instant, and only one that does not end is a writer's that died."""
    held = {p: e for p, e in found.items() if e.held_from is not None}
    if not held:
        return {}
    time.sleep(HELD_LOOK_S)
    again = consumer.end_offsets(list(held))  # read_committed: the last stable offsets
    return {p: e for p, e in held.items() if again.get(p) == e.held_from}


def _highwaters(bootstrap: str, security: KafkaSecurity, parts: list) -> dict:
    """Each partition's listed end for a `read_uncommitted` reader: past an open
    transaction, where a `read_committed` reader's stops."""
    consumer = sync_consumer(bootstrap, security=security, isolation_level="read_uncommitted")
    try:
        return consumer.end_offsets(parts) if parts else {}
    finally:
        consumer.close()


def _tail(consumer, found: dict[object, Extent], topic: str, deadline: float) -> Span:
    """The newest TAIL_MESSAGES records of each partition of `topic`, to the ends found."""
    bounds = {  # to the last stable offset: nothing past an open transaction is read
        p: (min(extent.tail(TAIL_MESSAGES), extent.stable), extent.stable)
        for p, extent in found.items()
        if p.topic == topic
    }
    return Span(consumer, bounds, deadline)


def _cut(extent: Extent) -> bool:
    return extent.tail(TAIL_MESSAGES) > extent.start


def _engines(
    messages: Iterable[MetricsMessage], reports: Iterable[LoadReportMessage]
) -> list[EngineSeen]:
    """Engines by the relQueries they answered and by their newest load report."""
    answered: Counter[str] = Counter()
    newest: dict[str, float] = {}
    for message in messages:
        answered[message.engine] += 1
        newest[message.engine] = max(newest.get(message.engine, 0.0), message.at)
    loads: dict[str, LoadReportMessage] = {}
    for report in reports:
        if report.engine not in loads or loads[report.engine].at < report.at:
            loads[report.engine] = report
    seen = []
    for name in sorted(set(answered) | set(loads)):
        load = loads.get(name)
        report = () if load is None else (load.outstanding_s, load.at, load.listens)
        seen.append(EngineSeen(name, answered[name], newest.get(name), *report))
    with ThreadPoolExecutor(max_workers=PROBES) as pool:
        probed = list(pool.map(_listening, seen))
    return [replace(e, listening=listening) for e, listening in zip(seen, probed, strict=True)]


def _listening(engine: EngineSeen) -> bool | None:
    """Whether something listens where the engine's report says it does: a refused
    connection says the engine is gone at once, where its idle reports come minutes apart. A
    loopback address is another machine's unless the engine (`host:pid`) runs on this
    one: not known."""
    if engine.listens is None:
        return None
    host, _, port = engine.listens.rpartition(":")
    host = host.strip("[]")
    here = engine.name.rpartition(":")[0] == socket.gethostname()
    if not here and ipaddress.ip_address(_resolved(host)).is_loopback:
        return None
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_S).close()
    except ConnectionRefusedError:
        return False
    except (OSError, ValueError):
        return None
    return True


def _resolved(host: str) -> str:
    """An address of `host` (itself where it is one; 0.0.0.0 where it does not resolve)."""
    try:
        return socket.getaddrinfo(host, None)[0][4][0]
    except OSError:
        return "0.0.0.0"


def _decoded(kind: type[M], records: Iterable) -> Iterator[M]:
    """The values that decode as `kind`; another program's messages are not ours to count."""
    for record in records:
        try:
            yield decode_record(kind, record.value, record.headers)
        except MessageError:
            continue
