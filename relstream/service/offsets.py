"""Which offsets of each partition may be committed: only a finished prefix, so a crash
replays every relQuery that had not been answered; and what a rebalance does to them."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

from aiokafka import ConsumerRebalanceListener
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError

log = logging.getLogger("relstream.engine")


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


async def commit_assigned(consumer, offsets: dict) -> None:
    """Commit `offsets` of the partitions still assigned. A commit the group refuses (it
    rebalanced meanwhile) is logged and dropped: the work is replayed by whoever owns the
    partition now, and results are keyed by id."""
    assigned = consumer.assignment()
    offsets = {tp: offset for tp, offset in offsets.items() if tp in assigned}
    if not offsets:
        return
    try:
        await consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError, KafkaError) as exc:
        log.warning("commit of %s refused (%s); the work will be replayed", offsets, exc)


class RevocationListener(ConsumerRebalanceListener):
    """Calls `on_revoked(partitions)` before partitions are taken away."""

    def __init__(self, on_revoked: Callable[[set], Awaitable[None]]) -> None:
        self._on_revoked = on_revoked

    async def on_partitions_revoked(self, revoked) -> None:
        await self._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        """New partitions start from their committed offsets: nothing to do."""
