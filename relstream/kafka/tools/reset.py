"""A query's consumer group moved, as `kafka-consumer-groups --reset-offsets` does.

A worker reads each query's rows topic with its own group (`worker_group`); once a fix
makes rows usable that it already committed past (a template typo dead-lettered them),
moving that group back makes the next worker read them again. Every partition of the
topic moves to the target: the log's start (`earliest`), its end (`latest`), the first
record at or after a time (ListOffsets by timestamp; the end where none is), or an offset,
kept within the log as Kafka's tool keeps it. A group with members is not moved: the
worker running it would commit over the move, so it must be stopped first. Tansu keeps
listing a stopped consumer as a member ("Stable", measured 12 s after it left) and refuses
a commit from outside the group (UnknownMemberId), so there a group that ever had a
member cannot be moved; Apache Kafka drops a member that leaves.

Moving back, each partition snaps to the start of the window that holds its target
(`windowstarts.snap`): the worker cuts the same windows again from there, so the rows it
reads again come under the ids they had and sinks, which keep one result per id, store
each row once. A move says which rows are read again and whether under known ids; rows
dead-lettered before are dead-lettered again.
"""

from __future__ import annotations

from dataclasses import dataclass

from relstream.kafka.clients.bounds import extents, partitions
from relstream.kafka.tools.groups import group_members
from relstream.kafka.tools.replay import parse_time
from relstream.kafka.tools.windowstarts import Snap, record_stamp, snap

EARLIEST, LATEST = "earliest", "latest"


@dataclass(frozen=True)
class ResetTarget:
    """Where to move: `earliest`, `latest`, `time` (seconds since the epoch) or `offset`."""

    kind: str
    value: float | int | None = None

    def __str__(self) -> str:
        return self.kind if self.value is None else f"{self.kind} {self.value}"


def parse_target(text: str) -> ResetTarget:
    """earliest, latest, an offset (a whole number) or an ISO 8601 time."""
    word = text.strip().lower()
    if word in (EARLIEST, LATEST):
        return ResetTarget(word)
    if word.isdigit():
        return ResetTarget("offset", int(word))
    try:
        return ResetTarget("time", parse_time(text))
    except ValueError:
        raise ValueError(
            f"{text!r} is not earliest, latest, an offset (a whole number) or an ISO 8601 "
            "time (2026-11-25T10:00)"
        ) from None


@dataclass(frozen=True)
class Move:
    partition: object  # kafka.TopicPartition
    current: int | None  # the group's committed offset; None where it has none
    new: int
    snapped: Snap | None = None  # why `new`, where the target was snapped (`windowstarts`)

    def line(self) -> str:
        current = "none" if self.current is None else str(self.current)
        line = f"{self.partition.topic}[{self.partition.partition}]: {current} -> {self.new}"
        snapped = self.snapped
        if snapped is not None and snapped.asked != self.new:
            line += f" (asked {snapped.asked}: {snapped.why})"
        elif snapped is not None and (self.again() is not None or self.current is None):
            line += f" ({snapped.why})"
        return line

    def again(self) -> tuple[int, int] | None:
        """The offsets (first, last) the worker reads again after the move; None: none."""
        if self.current is None or self.new >= self.current:
            return None
        return self.new, self.current - 1

    def sinks(self) -> str | None:
        """Which rows the move reads again or skips, and what a sink makes of them."""
        if self.current is not None and self.new > self.current:
            skipped = self.new - self.current
            return f"offsets {self.current}..{self.new - 1} ({skipped}) are skipped, never read"
        again = self.again()
        if again is None:
            return None
        rows = f"offsets {again[0]}..{again[1]} ({again[1] - again[0] + 1}) are read again"
        if self.snapped is not None and self.snapped.known:
            return f"{rows}, from a window's start: under the ids they had (sinks store each once)"
        return (
            f"{rows}, from inside a window: under a new id, which a sink stores a second "
            "time, and so are later windows until the cut meets a window start (a dry run "
            "with --config names them)"
        )


class GroupBusy(RuntimeError):
    """The group has active members: a worker is running it."""


class ResetError(ValueError):
    """The group or topic cannot be moved as asked (named in the message)."""


def check_idle(admin, group: str) -> None:
    """GroupBusy naming the group's members, unless it has none."""
    members = group_members(admin, [group]).get(group)
    if members:
        raise GroupBusy(
            f"group {group} has {len(members)} active member(s) ({', '.join(members)}): "
            "stop the worker reading it first (a killed worker's member leaves once its "
            "session times out; Tansu keeps listing stopped ones)"
        )


def committed_topics(admin, group: str, prefix: str) -> list[str]:
    """The rows topics (under `prefix`) the group has committed offsets on."""
    committed = admin.list_group_offsets(group).get(group, {})
    return sorted({p.topic for p in committed if p.topic.startswith(f"{prefix}rows.")})


def plan_moves(
    consumer,
    admin,
    group: str,
    topic: str,
    target: ResetTarget,
    starts: dict[int, dict[int, int]] | None = None,
) -> list[Move]:
    """Where each partition of `topic` would move; `consumer` joins no group. A target
    before the group's committed offset snaps back to the start of its window among
    `starts` (partition -> {first offset: first row's ms}, `windowstarts.known_starts`)."""
    parts = partitions(consumer, [topic])
    if not parts:
        raise ResetError(f"topic {topic} does not exist")
    found = extents(consumer, parts)
    committed = admin.list_group_offsets(group).get(group, {})
    at_time = {}
    if target.kind == "time":
        at_time = _offsets_at(consumer, parts, int(target.value * 1000))
    moves = []
    for part in parts:
        start, end = found[part].start, found[part].end
        if target.kind == EARLIEST:
            new = start
        elif target.kind == LATEST:
            new = end
        elif target.kind == "offset":
            new = target.value
        else:
            new = end if at_time.get(part) is None else at_time[part]
        current = committed.get(part)
        current = None if current is None or current.offset < 0 else current.offset
        asked = min(max(new, start), end)
        snapped = snap(
            asked,
            current,
            start,
            (starts or {}).get(part.partition, {}),
            lambda offset, part=part: record_stamp(consumer, part, offset),
        )
        moves.append(Move(part, current, snapped.new, snapped))
    return moves


def _offsets_at(consumer, parts: list, ms: int) -> dict:
    """The first offset stamped at or after `ms` in each partition; None where no record
    is. An answer stamped before `ms` found none: Tansu answers so (offset 0, stamp -1)
    where Kafka answers no offset."""
    asked = consumer.offsets_for_times(dict.fromkeys(parts, ms))
    return {
        p: None if found is None or found.timestamp < ms else found.offset
        for p, found in asked.items()
    }


def commit_moves(admin, group: str, moves: list[Move]) -> None:
    """Commit the moves as the group's offsets; ResetError naming any partition refused."""
    from kafka.errors import NoError
    from kafka.structs import OffsetAndMetadata

    offsets = {move.partition: OffsetAndMetadata(move.new, "", None) for move in moves}
    answered = admin.alter_group_offsets(group, offsets)
    refused = {p: error for p, error in answered.items() if error is not NoError}
    if refused:
        said = ", ".join(f"{p.topic}[{p.partition}]: {e.__name__}" for p, e in refused.items())
        raise ResetError(f"the broker refused to move group {group} on {said}")
