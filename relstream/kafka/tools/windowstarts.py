"""Where a reset moves a query's group so that the rows it reads again keep their ids.

The worker cuts each rows partition into windows from the records alone, beginning where
it begins reading (`stream.windowing`), and names a window
`<query>-<partition>-<first offset>@<first row's ms>`. Read again from a window's first
offset, the cut repeats: that window and every later one come again under the ids they
had, and a sink, which keeps one result per id, stores each row once. Read from any other
offset, the first window is cut anew, and so is every later one until the cut happens to
meet a window start: under ids no sink has seen, so it stores those rows a second time.

So a reset snaps each partition's target back to the first offset of the window that
holds it (`snap`). The window starts are the ids the worker published, read from the
relqueries and results topics (`published_ids`); one counts only while its first row is
still in the log under that timestamp, since retention deletes rows and a re-created
topic numbers its offsets from 0 again. Where no start is known at or before the target
(retention deleted it, or the ids are gone too) the group moves to the target as asked
and the move says that the rows from there come under new ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from relstream.kafka.clients.bounds import Span, extents, partitions
from relstream.wire.windowid import WindowId


def known_starts(ids: Iterable[str], query: str) -> dict[int, dict[int, int]]:
    """The window starts named by `query`'s ids among `ids`: partition -> {first offset:
    first row's ms}. Ids of earlier releases (no `@<ms>`) do not say which rows they had,
    so they are never a known start (`WindowId.parse`)."""
    starts: dict[int, dict[int, int]] = {}
    for relquery_id in ids:
        window = WindowId.parse(relquery_id)
        if window is not None and window.query == query:
            starts.setdefault(window.partition, {})[window.offset] = window.ms
    return starts


@dataclass(frozen=True)
class Snap:
    """One partition's move: the target `asked` (within the log) and where the group goes
    (`new`), with why; `known`: `new` is the start of a window published before."""

    asked: int
    new: int
    known: bool
    why: str


def snap(
    asked: int,
    current: int | None,
    log_start: int,
    starts: Mapping[int, int],
    stamp: Callable[[int], int | None],
) -> Snap:
    """Where to move one partition whose group has committed `current` (None: nothing)
    when `asked` is the target: the greatest known window start (`starts`: first offset
    -> first row's ms) at or before it whose row is still in the log (from `log_start`)
    and stamped that ms (`stamp(offset)`: the record's timestamp in ms, None where it is
    gone). A target at or past `current` reads no row again, so it stays as asked."""
    if current is None:
        return Snap(asked, asked, False, "the group has committed nothing here")
    if asked >= current:
        return Snap(asked, asked, False, "at or past the committed offset")
    for offset in sorted((o for o in starts if log_start <= o <= asked), reverse=True):
        if stamp(offset) == starts[offset]:
            where = "a window's start" if offset == asked else "back to its window's start"
            return Snap(asked, offset, True, where)
    if any(offset < log_start for offset in starts):
        why = "retention deleted its window's start"
    else:
        why = "no window start at or before it is known"
    return Snap(asked, asked, False, why)


def published_ids(consumer, topics: list[str]) -> Iterator[str]:
    """The keys of every record now on `topics` (the relqueries and results topics are
    keyed by relQuery id): read whole, so a reset takes as long as reading them."""
    parts = partitions(consumer, topics)
    found = extents(consumer, parts)
    span = Span(consumer, {p: (e.start, e.end) for p, e in found.items()}, None)
    for record in span:
        if record.key is not None:
            yield record.key.decode("utf-8", "replace")


def record_stamp(consumer, partition, offset: int) -> int | None:
    """The timestamp in ms of the record at `offset` of `partition`; None where there is
    none (deleted, or past the end)."""
    for record in Span(consumer, {partition: (offset, offset + 1)}, None):
        return record.timestamp if record.offset == offset else None
    return None
