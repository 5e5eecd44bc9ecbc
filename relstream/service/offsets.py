"""Which offsets of each partition may be committed: only a finished prefix, so a crash
replays every relQuery that had not been answered.

Where the broker has transactions, a relQuery's result and its partition's offset are
committed together, and the engine answers out of order (its scheduler reorders), so a
commit also names the offsets finished above the prefix (`ahead`): a new owner of the
partition skips them instead of answering them again. They ride in the offset commit's
metadata string (`encode_ahead`), which Kafka bounds (4096 bytes by default), so at most
`MAX_AHEAD` offsets are finished above a prefix: a result further ahead waits
(`OffsetBook.may_finish`) until the prefix moves.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection

MAX_AHEAD = 256  # finished offsets above a partition's prefix, at most (in one commit)
_AHEAD_TAG = "relstream-ahead:1:"  # the metadata's format, and its version


class OffsetBook:
    """Per partition: which offsets started and finished, and what may be committed.

    Work belongs to the assignment it was read under: `start` returns that assignment's
    lease, and only work holding the partition's current lease may finish or commit. A
    partition revoked and handed back (a session expired, the same partitions given back
    at once) gets a new lease, so the old assignment's work, still running, can neither
    mark the new one's offsets done nor commit with its producer."""

    def __init__(self) -> None:
        self._pending: dict[object, deque[int]] = {}  # started, in order, from the prefix
        self._done: dict[object, set[int]] = {}  # finished among `_pending`
        self._next: dict[object, int] = {}  # just past the last offset popped as done
        self._lease: dict[object, int] = {}  # the current assignment's, per partition
        self._leases = 0  # leases handed out: each new assignment's is the next

    def start(self, partition, offset: int) -> int:
        """Mark `offset` started; returns the lease its work carries (`holds`)."""
        if partition not in self._lease:
            self._leases += 1
            self._lease[partition] = self._leases
        self._pending.setdefault(partition, deque()).append(offset)
        self._done.setdefault(partition, set())
        return self._lease[partition]

    def holds(self, partition, lease: int) -> bool:
        """Whether `lease` is the partition's current assignment's (not revoked since)."""
        return self._lease.get(partition) == lease

    def finish(self, partition, offset: int, lease: int) -> None:
        """Mark `offset` done; ignored for work of an ended assignment (`holds`)."""
        if self.holds(partition, lease):
            self._done[partition].add(offset)

    def committable(self, partitions: Collection | None = None) -> dict[object, int]:
        """Next offset to commit per partition (of `partitions`, or all): just past the
        finished prefix."""
        out = {}
        for partition, pending in self._pending.items():
            if partitions is not None and partition not in partitions:
                continue
            done = self._done[partition]
            last = None
            while pending and pending[0] in done:
                last = pending.popleft()
                done.discard(last)
            if last is not None:
                out[partition] = self._next[partition] = last + 1
        return out

    def is_prefix(self, partition, offset: int) -> bool:
        """Whether `offset` is its partition's first unfinished one (or unknown)."""
        done = self._done.get(partition, set())
        for started in self._pending.get(partition, ()):
            if started not in done:
                return started == offset
        return True

    def unfinished(self, partition, offset: int, lease: int) -> bool:
        """Whether `offset` started under `lease`, still current, and is not finished."""
        return (
            self.holds(partition, lease)
            and offset in self._pending[partition]
            and offset not in self._done[partition]
        )

    def may_finish(self, partition, offset: int, reserved: int = 0) -> bool:
        """Whether finishing `offset` keeps at most `MAX_AHEAD` offsets finished above the
        prefix, `reserved` more being on their way there: always for the prefix's own
        offset, which only shrinks them."""
        if self.is_prefix(partition, offset):
            return True
        return len(self._done[partition]) + reserved < MAX_AHEAD

    def progress(self, partition, offset: int) -> tuple[int, frozenset[int]]:
        """Where `partition` stands once `offset` is finished too, without marking it: the
        next offset to read (the first unfinished one started, or just past the last
        finished) and the finished offsets above it."""
        pending = self._pending[partition]
        done = self._done[partition] | {offset}
        index = 0
        while index < len(pending) and pending[index] in done:
            index += 1
        if index < len(pending):
            first = pending[index]
        elif index:
            first = pending[index - 1] + 1
        else:
            first = self._next.get(partition, offset + 1)
        return first, frozenset(o for o in done if o > first)

    def forget(self, partitions) -> None:
        """The partitions' assignment ended: their work's leases lapse."""
        for partition in partitions:
            self._lease.pop(partition, None)
            self._pending.pop(partition, None)
            self._done.pop(partition, None)
            self._next.pop(partition, None)


def encode_ahead(ahead: Collection[int], base: int) -> str:
    """The offsets finished above `base` as an offset commit's metadata: their distances
    from `base`, ascending, in base 36 (at most `MAX_AHEAD`: under 1.3 KB for any spread
    below 36**3 offsets)."""
    if not ahead:
        return ""
    return _AHEAD_TAG + ",".join(_base36(offset - base) for offset in sorted(ahead))


def decode_ahead(metadata: str | None, base: int) -> frozenset[int]:
    """The offsets `encode_ahead` wrote against `base`; none from metadata it did not
    write (another tool's commit, or an older relstream's)."""
    if not metadata or not metadata.startswith(_AHEAD_TAG):
        return frozenset()
    try:
        distances = [int(d, 36) for d in metadata[len(_AHEAD_TAG) :].split(",")]
    except ValueError:
        return frozenset()
    return frozenset(base + d for d in distances if d > 0)


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        number, digit = divmod(number, 36)
        out = digits[digit] + out
        if not number:
            return out


class PublishedOffsets:
    """relQueries this engine has answered (result or dead letter) whose offsets may not
    be committed yet, when the broker has no transactions. A partition revoked while they
    were served, then handed back, replays them from its last commit: they are skipped,
    not served and published twice. Each is known by its offset and its relQuery id (the
    message key): after a broker restarts empty, the same offsets hold new relQueries."""

    def __init__(self) -> None:
        self._offsets: dict[object, dict[int, bytes | None]] = {}

    def add(self, partition, offset: int, key: bytes | None) -> None:
        self._offsets.setdefault(partition, {})[offset] = key

    def __contains__(self, place: tuple[object, int, bytes | None]) -> bool:
        partition, offset, key = place
        answered = self._offsets.get(partition, {})
        return offset in answered and answered[offset] == key

    def committed(self, offsets: dict[object, int]) -> None:
        """Commits reached these next offsets: what lies below needs no memory."""
        for partition, next_offset in offsets.items():
            kept = {o: k for o, k in self._offsets.get(partition, {}).items() if o >= next_offset}
            if kept:
                self._offsets[partition] = kept
            else:
                self._offsets.pop(partition, None)
