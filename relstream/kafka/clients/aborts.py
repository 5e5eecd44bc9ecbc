"""A `read_committed` fetch that starts past an aborted transaction's end must not skip the
committed records its producer wrote after it.

A fetch response lists the aborted transactions the fetched range overlaps, as (producer
id, first offset); the client skips that producer's transactional batches from the first
offset until it reads the transaction's ABORT marker. Kafka lists a transaction only if
it was still open at the fetch offset (its last offset at or past it). noida-db, the
default broker, also lists transactions that ended before: a fetch that starts after
their ABORT marker never reads that marker, so aiokafka skipped every later batch of the
same producer, committed ones included. Measured on the crash drill's store: relqueries
partition 3, a window's relQuery aborted at offset 10 (its marker at 11) and committed
again by the same producer at 12; a fetch from 10 or 11 gives 12, a fetch from 12 gives
14 onward, and an engine that took the partition over at 12 never answered it. A
producer keeps its id when its transaction is redone (a renewed producer gets the next
epoch), so every redo after an abort could be lost so, by engines and sinks alike.

`drop_ended_aborts` (installed once per process by `clients.new_consumer` and
`sync.sync_consumer`, in aiokafka's fetcher and kafka-python's) keeps, of the
listed transactions that began before the fetch offset, only those whose producer's
first marker in the fetched data is an ABORT: a transaction open at the fetch offset
ends with its ABORT marker, and its producer can write no COMMIT before it. One whose
producer's first marker there is a COMMIT had ended before the fetch offset, and is
dropped. With no marker of that producer in the data, the broker's word stands. Against
Kafka nothing is ever dropped: it lists only transactions open at the fetch offset.
"""

from __future__ import annotations

import aiokafka.consumer.fetcher as fetcher
from aiokafka.record.control_record import ABORT_MARKER, ControlRecord
from aiokafka.record.memory_records import MemoryRecords

_installed = False


class _KeptRecords:
    """The fetched bytes as aiokafka reads them, kept so they can be read twice."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._records = MemoryRecords(data)

    def has_next(self) -> bool:
        return self._records.has_next()

    def next_batch(self):
        return self._records.next_batch()

    def size_in_bytes(self) -> int:
        return self._records.size_in_bytes()


def first_markers(data: bytes, producers: set[int]) -> dict[int, bool]:
    """For each of `producers`, whether its first control marker in `data` is an ABORT
    (absent: no marker of it there)."""
    found: dict[int, bool] = {}
    records = MemoryRecords(data)
    while records.has_next() and len(found) < len(producers):
        batch = records.next_batch()
        pid = batch.producer_id
        if batch.is_control_batch and pid in producers and pid not in found:
            control = next(batch, None)
            found[pid] = control is not None and (
                ControlRecord.parse(control.key) == ABORT_MARKER
            )
    return found


def ended(aborted: list[tuple[int, int]], fetch_offset: int, data: bytes) -> set:
    """Of the listed aborted transactions (producer id, first offset), those that ended
    before `fetch_offset`: begun before it, and whose producer's first marker in `data`
    is a COMMIT."""
    earlier = {pid for pid, first in aborted if first < fetch_offset}
    if not earlier:
        return set()
    markers = first_markers(data, earlier)
    return {
        (pid, first) for pid, first in aborted
        if first < fetch_offset and markers.get(pid) is False
    }  # fmt: skip


def still_open(aborted, fetch_offset: int, data: bytes) -> list:
    """aiokafka's list (tuples) without the transactions that `ended`."""
    aborted = [tuple(entry) for entry in aborted or []]
    gone = ended(aborted, fetch_offset, data)
    return [entry for entry in aborted if entry not in gone]


class _PartitionRecords(fetcher.PartitionRecords):
    def __init__(self, tp, records, aborted_transactions, fetch_offset, *args) -> None:
        if isinstance(records, _KeptRecords) and aborted_transactions:
            aborted_transactions = still_open(aborted_transactions, fetch_offset, records.data)
        super().__init__(tp, records, aborted_transactions, fetch_offset, *args)


def drop_ended_aborts() -> None:
    """Install the check in aiokafka's fetcher, and in kafka-python's where it is
    installed (`kafka.clients.sync`'s readers: results, sinks, status); idempotent."""
    global _installed
    if _installed:
        return
    fetcher.MemoryRecords = _KeptRecords
    fetcher.PartitionRecords = _PartitionRecords
    try:
        from kafka.consumer.fetcher import Fetcher
    except ImportError:  # kafka-python is the sync client's; an engine may lack it
        pass
    else:
        Fetcher.PartitionRecords = _sync_records(Fetcher.PartitionRecords)
    _installed = True


def _sync_records(base):
    """kafka-python's PartitionRecords with the same check (its records keep their
    bytes)."""

    class PartitionRecords(base):
        def __init__(self, fetch_offset, tp, records, *args, aborted_transactions=None, **kw):
            if aborted_transactions:
                pairs = [(a.producer_id, a.first_offset) for a in aborted_transactions]
                gone = ended(pairs, fetch_offset, bytes(records._buffer))
                aborted_transactions = [
                    a for a in aborted_transactions if (a.producer_id, a.first_offset) not in gone
                ]
            super().__init__(fetch_offset, tp, records, *args,
                             aborted_transactions=aborted_transactions, **kw)  # fmt: skip

    return PartitionRecords
