"""The windows a worker will cut from records it reads again, for `relstream reset
--dry-run`: the worker's own cut (`windowing`) run over the records from where the group
moves to where it had committed, with each window's id checked against the ids already
published, so the dry run says which rows come under ids a sink has and which under new
ones."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import MESSAGE_BYTES, PartitionWindows, RowRejection, Window


@dataclass
class Recut:
    """What reading one partition's records again makes."""

    known: list[Window] = field(default_factory=list)  # under ids published before
    new: list[Window] = field(default_factory=list)  # under ids no sink has seen
    rejected: int = 0  # rows dead-lettered again

    def rows(self, windows: list[Window]) -> int:
        return sum(len(window.rows) for window in windows)


def recut(
    registration: QueryRegistration,
    partition: int,
    records: Iterable,
    published: set[str],
    message_bytes: int = MESSAGE_BYTES,
) -> Recut:
    """Cut `records` (kafka-python's, in offset order, from a window start or the move's
    target) as the worker will; the window still open at the end is counted too (the
    worker closes it on the rows after it, or by its clock). `message_bytes`: the broker's
    message limit the worker cuts under (`kafka.clients.limits.message_limit`)."""
    cutter = PartitionWindows(registration, partition, message_bytes=message_bytes)
    windows: list[Window] = []
    found = Recut()
    for record in records:
        checked = cutter.check(record.value, record.headers)
        row, size = None, None
        if isinstance(checked, RowRejection):
            found.rejected += 1
        else:
            row, size = checked
        stamp = record.timestamp / 1000 if record.timestamp >= 0 else time.time()
        windows += cutter.add(record.offset, stamp, row, size)
    if cutter.open is not None:
        windows.append(cutter.open)
    for window in windows:
        name = window.window_id(registration.name).format()
        (found.known if name in published else found.new).append(window)
    return found
