"""Where each partition's log starts and truly ends, and reading partitions up to there:
for the readers that only look (`relstream status`, `results`, `deadletters`), on a
kafka-python consumer with no consumer group.

A partition's end is asked once (ListOffsets "latest") and then checked by fetching its
last batch: Tansu answers "latest" with its last batch's first offset + 1, so a batch of
50 records there counts as one. A reader then reads each partition to the ends found at
its start, never "until idle": on a live pipeline an engine writes every second.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

POLL_MS = 200
PROBE_S = 3.0  # fetching the last batches of every partition, at most
STALL_S = 10.0  # a span that read nothing and moved no position for this long ends


@dataclass(frozen=True)
class Extent:
    """A partition's log: offsets `start` (the oldest kept) to `end` (the next written)."""

    start: int
    end: int
    # Where an open transaction begins (the last stable offset, below `end`): a
    # `read_committed` reader waits there until its writer commits or aborts. None: none.
    held_from: int | None = None

    @property
    def stable(self) -> int:
        """The end a `read_committed` reader reaches now."""
        return self.end if self.held_from is None else self.held_from

    @property
    def offsets(self) -> int:
        """Records in the log where offsets have no gaps (no compaction, no transaction
        markers); otherwise an upper bound."""
        return max(0, self.end - self.start)

    def tail(self, newest: int) -> int:
        """Where reading the newest `newest` records begins, never before the log start."""
        return max(self.start, self.end - newest)


def partitions(consumer, names: list[str]) -> list:
    """Every partition of the named topics, in order."""
    from kafka import TopicPartition

    return [
        TopicPartition(name, number)
        for name in names
        for number in sorted(consumer.partitions_for_topic(name) or ())
    ]


def extents(
    consumer, parts: list, probe_s: float = PROBE_S, highwaters: dict | None = None
) -> dict:
    """Each partition's Extent now. The listed end is checked by fetching from its last
    offset: the records that fetch returns (the whole last batch) and the high watermark
    of its answer give the true end where the listed one is short. A partition whose
    fetch does not answer within `probe_s` keeps its listed end. `consumer` reads
    committed messages, so its listed end is the last stable offset: where the high
    watermark lies past it and past every record read, an open transaction holds the
    partition from there (`Extent.held_from`); `highwaters` (a `read_uncommitted`
    reader's listed ends) show it where nothing was probed. Tansu, whose listed ends are
    short, has no transactions: its records past them are read, so nothing is held."""
    if not parts:
        return {}
    starts = consumer.beginning_offsets(parts)
    listed = consumer.end_offsets(parts)
    stable = {p: max(listed[p], starts[p]) for p in parts}
    ends = {p: max(stable[p], (highwaters or {}).get(p, 0)) for p in parts}
    probed = sorted(p for p in parts if ends[p] > starts[p])
    pending = set(probed)
    if pending:
        consumer.assign(probed)
        for partition in pending:
            consumer.seek(partition, ends[partition] - 1)
        deadline = time.monotonic() + probe_s
        while pending and time.monotonic() < deadline:
            for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
                ends[partition] = max(ends[partition], records[-1].offset + 1)
                stable[partition] = max(stable[partition], records[-1].offset + 1)
                pending.discard(partition)
            for partition in probed:
                highwater = consumer.highwater(partition)
                if highwater is not None:
                    ends[partition] = max(ends[partition], highwater)
                    # read past a last marker, or up to an open transaction: done
                    if consumer.position(partition) >= stable[partition]:
                        pending.discard(partition)
        consumer.assign([])
    return {
        p: Extent(starts[p], ends[p], stable[p] if stable[p] < ends[p] else None) for p in parts
    }


@dataclass
class Span:
    """Reading partitions from given offsets up to given ends: iterate for the records
    (oldest first within a partition); `unread` then holds the partitions not read to
    their end (the deadline passed first, or STALL_S without progress: a broker that
    serves no record up to an end it listed)."""

    consumer: object
    bounds: dict  # partition -> (first offset, end offset)
    deadline: float | None = None  # time.monotonic(); None: read to the ends however long
    unread: set = field(default_factory=set)

    def __iter__(self) -> Iterator:
        consumer = self.consumer
        self.unread = {p for p, (first, end) in self.bounds.items() if first < end}
        if not self.unread:
            return
        consumer.assign(sorted(self.unread))
        consumer.resume(*self.unread)  # a partition an earlier span paused
        for partition in self.unread:
            consumer.seek(partition, self.bounds[partition][0])
        moved = time.monotonic()
        while self.unread and (self.deadline is None or time.monotonic() < self.deadline):
            if time.monotonic() - moved > STALL_S:
                return
            for partition, records in consumer.poll(timeout_ms=POLL_MS).items():
                moved = time.monotonic()
                end = self.bounds[partition][1]
                for record in records:
                    if record.offset < end:
                        yield record
            for partition in list(self.unread):
                # position: past the last record read, or past a gap (compaction, markers)
                if consumer.position(partition) >= self.bounds[partition][1]:
                    self.unread.discard(partition)
                    consumer.pause(partition)
                    moved = time.monotonic()


def count_records(consumer, spans: dict, deadline: float | None) -> dict:
    """The records a reader finds in each span (partition -> (first, end) offsets): for
    a `read_committed` consumer, transaction markers and aborted records are not counted.
    Only the spans read to their end by `deadline` are in the answer."""
    if not spans:
        return {}
    span = Span(consumer, spans, deadline)
    found = Counter((record.topic, record.partition) for record in span)
    return {p: found[(p.topic, p.partition)] for p in spans if p not in span.unread}
