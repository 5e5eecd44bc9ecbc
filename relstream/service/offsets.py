"""Which offsets of each partition may be committed: only a finished prefix, so a crash
replays every relQuery that had not been answered."""

from __future__ import annotations

from collections.abc import Collection


class OffsetBook:
    """Per partition: which offsets started and finished, and what may be committed."""

    def __init__(self) -> None:
        self._pending: dict[object, list[int]] = {}
        self._done: dict[object, set[int]] = {}

    def start(self, partition, offset: int) -> None:
        self._pending.setdefault(partition, []).append(offset)
        self._done.setdefault(partition, set())

    def finish(self, partition, offset: int) -> None:
        """Mark `offset` done; ignored for a partition forgotten since (revoked)."""
        if partition in self._done:
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
                last = pending.pop(0)
                done.discard(last)
            if last is not None:
                out[partition] = last + 1
        return out

    def forget(self, partitions) -> None:
        for partition in partitions:
            self._pending.pop(partition, None)
            self._done.pop(partition, None)


class PublishedOffsets:
    """Offsets whose relQuery this engine has answered (result or dead letter) that may
    not be committed yet. A partition revoked while they were served, then handed back,
    replays them from its last commit: they are skipped, not served and published twice."""

    def __init__(self) -> None:
        self._offsets: dict[object, set[int]] = {}

    def add(self, partition, offset: int) -> None:
        self._offsets.setdefault(partition, set()).add(offset)

    def __contains__(self, place: tuple[object, int]) -> bool:
        partition, offset = place
        return offset in self._offsets.get(partition, ())

    def committed(self, offsets: dict[object, int]) -> None:
        """Commits reached these next offsets: what lies below needs no memory."""
        for partition, next_offset in offsets.items():
            kept = {o for o in self._offsets.get(partition, ()) if o >= next_offset}
            if kept:
                self._offsets[partition] = kept
            else:
                self._offsets.pop(partition, None)
