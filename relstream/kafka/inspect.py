"""What `relstream status` shows of a pipeline, read from its broker alone: each topic's
size, each consumer group's lag by topic (what `kafka-consumer-groups --describe` gives),
the engines seen answering, and the dead letters by reason.

On kafka-python's admin client, which answers group offsets on Apache Kafka and both
embedded brokers. Tansu reports a partition's end as its last batch's first offset + 1, so
there sizes and lags count a batch of records as one: lower bounds.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeVar

from relstream.kafka.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.sync import sync_admin, sync_consumer
from relstream.kafka.topics import Topics
from relstream.schemas import DeadLetterMessage, MessageError, MetricsMessage, decode

M = TypeVar("M", DeadLetterMessage, MetricsMessage)
TAIL_MESSAGES = 10_000  # the newest metrics and dead letters read, per partition
READ_IDLE_S = 1.0  # a tail is read once no record came for this long


@dataclass(frozen=True)
class TopicSize:
    name: str
    partitions: int
    messages: int  # end minus start offsets, over its partitions


@dataclass(frozen=True)
class GroupLag:
    group: str
    stage: str  # what the group is, from the topics it reads: worker, engines, readers
    lag: dict[str, int]  # topic -> messages not yet committed, over its partitions
    members: int | None  # None where the broker would not describe the group


@dataclass(frozen=True)
class EngineSeen:
    name: str  # host:pid
    answered: int  # relQueries answered among the metrics read
    last_answer_at: float  # wall time of its newest answer


@dataclass(frozen=True)
class PipelineStatus:
    topics: list[TopicSize]
    groups: list[GroupLag]
    engines: list[EngineSeen]
    dead_letters: Counter[str]  # reason kind -> letters


def reason_kind(reason: str) -> str:
    """A dead letter's reason without its particulars: what to count letters by."""
    return re.split(r"[:(]", reason)[0].strip()


def stage_of(topics: Topics, read: set[str]) -> str:
    """What a consumer group is, from the topics it has committed offsets on."""
    if any(name.startswith(topics.rows("")) for name in read):
        return "worker"
    if topics.relqueries in read:
        return "engines"
    if read & {topics.results, topics.partial_results}:
        return "results reader"
    return "reader"


def pipeline_status(
    bootstrap: str, topics: Topics, security: KafkaSecurity = PLAINTEXT
) -> PipelineStatus:
    admin = sync_admin(bootstrap, security)
    consumer = sync_consumer(bootstrap, security=security, enable_auto_commit=False)
    try:
        names = sorted(n for n in admin.list_topics() if n.startswith(topics.prefix))
        partitions = _partitions(consumer, names)
        ends = consumer.end_offsets(partitions)
        starts = consumer.beginning_offsets(partitions)
        sizes = [
            TopicSize(
                name,
                sum(p.topic == name for p in partitions),
                sum(ends[p] - starts[p] for p in partitions if p.topic == name),
            )
            for name in names
        ]
        groups = [_lag(admin, group, topics, ends) for group in _groups(admin)]
        engines = _engines(consumer, _partitions(consumer, [topics.metrics]), ends)
        letters = Counter(
            reason_kind(letter.reason)
            for letter in _decoded(
                DeadLetterMessage, _tail(consumer, _partitions(consumer, [topics.deadletter]), ends)
            )
        )
    finally:
        consumer.close()
        admin.close()
    return PipelineStatus(sizes, [g for g in groups if g.lag], engines, letters)


def _partitions(consumer, names: list[str]) -> list:
    from kafka import TopicPartition

    return [
        TopicPartition(name, number)
        for name in names
        for number in sorted(consumer.partitions_for_topic(name) or ())
    ]


def _groups(admin) -> list[str]:
    return sorted(entry["group_id"] for entry in admin.list_groups())


def _lag(admin, group: str, topics: Topics, ends: dict) -> GroupLag:
    """The group's lag on the pipeline's topics (those it has no offsets on left out)."""
    committed = admin.list_group_offsets(group).get(group, {})
    lag: Counter[str] = Counter()
    for partition, offset in committed.items():
        if partition in ends and offset.offset >= 0:
            lag[partition.topic] += max(0, ends[partition] - offset.offset)
    try:
        members = len(admin.describe_groups([group])[group]["members"])
    except Exception:  # Tansu's answer does not parse in kafka-python: members unknown
        members = None
    return GroupLag(group, stage_of(topics, set(lag)), dict(lag), members)


def _engines(consumer, partitions: list, ends: dict) -> list[EngineSeen]:
    answered: Counter[str] = Counter()
    newest: dict[str, float] = {}
    for message in _decoded(MetricsMessage, _tail(consumer, partitions, ends)):
        answered[message.engine] += 1
        newest[message.engine] = max(newest.get(message.engine, 0.0), message.at)
    return [EngineSeen(name, answered[name], newest[name]) for name in sorted(answered)]


def _tail(consumer, partitions: list, ends: dict) -> Iterator[bytes]:
    """The newest TAIL_MESSAGES values of each partition, oldest first."""
    if not partitions:
        return
    consumer.assign(partitions)
    for partition in partitions:
        consumer.seek(partition, max(0, ends[partition] - TAIL_MESSAGES))
    last = time.monotonic()
    while time.monotonic() - last < READ_IDLE_S:
        for records in consumer.poll(timeout_ms=200).values():
            last = time.monotonic()
            yield from (record.value for record in records)


def _decoded(kind: type[M], values: Iterator[bytes]) -> Iterator[M]:
    """The values that decode as `kind`; another program's messages are not ours to count."""
    for value in values:
        try:
            yield decode(kind, value)
        except MessageError:
            continue
