"""Which offsets of each partition may be committed: only a finished prefix, so a crash
replays every relQuery that had not been answered."""

from __future__ import annotations


class OffsetBook:
    """Per partition: which offsets started and finished, and what may be committed."""

    def __init__(self) -> None:
        self._pending: dict[object, list[int]] = {}
        self._done: dict[object, set[int]] = {}

    def start(self, partition, offset: int) -> None:
        self._pending.setdefault(partition, []).append(offset)
        self._done.setdefault(partition, set())

    def finish(self, partition, offset: int) -> None:
        self._done[partition].add(offset)

    def committable(self) -> dict[object, int]:
        """Next offset to commit per partition: just past the finished prefix."""
        out = {}
        for partition, pending in self._pending.items():
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
