"""How the engine commits what it answered: exactly once where the broker has
transactions (`ExactlyOnce`), at least once elsewhere (`AtLeastOnce`). Both publish a
relQuery's answer (result parts or dead letter), mark its offset finished, say whether a
message was already answered, and follow the partitions' assignment.

A relQuery's result (all its parts) or its dead letter, and its partition's offset, are
committed in one transaction (`kafka.transactions`), so a `read_committed` reader sees
exactly one result per relQuery whatever is killed or rebalanced: an engine that dies
mid-transaction leaves nothing visible, and the partition's next owner, whose producer
fences the old one, answers it again.

The engine answers a partition's relQueries out of order, but an offset commit is a
prefix. So each commit carries the offsets finished above its prefix in its metadata
(`offsets.encode_ahead`); the next owner reads them back on assignment and skips them.
At most `offsets.MAX_AHEAD` are carried: a result further ahead of its prefix waits until
the prefix moves (slots are reserved before the transaction, so concurrent results
cannot overshoot).

Without transactions (Tansu refuses `InitProducerId`) the engine says so once at start
and runs at least once: each answer is published until the broker has it, then its
offset is finished, and the consumer commits the finished prefix. A partition handed
back replays what was answered and not yet committed; those are skipped, known by
offset and relQuery id (offsets repeat after a broker restarts empty).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter

from aiokafka import TopicPartition

from relstream.kafka.clients import commit_assigned
from relstream.kafka.delivery import (
    Send,
    dead_letter_of,
    publish_letter,
    publish_sends,
    send_dead_letter,
)
from relstream.kafka.transactions import PartitionProducers, rejoin
from relstream.kafka.txfaults import Fenced
from relstream.kafka.txprobe import has_transactions
from relstream.service.offsets import OffsetBook, PublishedOffsets, decode_ahead, encode_ahead

log = logging.getLogger("relstream.engine")


class ExactlyOnce:
    """Transactional commits of the partitions the engine owns."""

    def __init__(self, config, book: OffsetBook) -> None:
        self._config = config
        self._book = book
        self._producers = PartitionProducers(
            config.bootstrap, config.group_id, config.security, config.stall_s,
            on_fenced=self._fenced, co_partition=True,
        )  # fmt: skip
        self._consumer = None  # the group's consumer, known from its first assignment
        self._skip: dict[object, frozenset[int]] = {}  # finished above the commit read
        self._reserved: Counter = Counter()  # results on their way above each prefix
        self._moved = asyncio.Condition()  # a prefix moved, or a partition left

    @classmethod
    async def start(cls, config, book: OffsetBook) -> ExactlyOnce | None:
        """The commits, or None (said once, in one log line) where the broker has no
        transactions or `config.transactions` is off."""
        if not config.transactions:
            log.info("transactions off: at least once (results keyed by relQuery id)")
            return None
        ok, why = await has_transactions(config.bootstrap, config.group_id, config.security)
        if not ok:
            log.warning(
                "the broker has no transactions (%s): at least once, a relQuery may be "
                "answered twice after a crash (results keyed by relQuery id)", why,
            )  # fmt: skip
            return None
        log.info("exactly once: each result and its offset are committed in one transaction")
        return cls(config, book)

    async def assigned(self, consumer, partitions) -> None:
        """Fence the partitions' previous owners and seek each to where they left off
        (`PartitionProducers.take_over`); the offsets finished above a committed offset
        are to be skipped."""
        self._consumer = consumer
        marks = await self._producers.take_over(consumer, partitions)
        for partition, mark in marks.items():
            self._skip[partition] = decode_ahead(mark.metadata, mark.offset)
            if self._skip[partition]:
                log.info(
                    "%s: %d relQueries above offset %d were answered by its previous owner",
                    partition, len(self._skip[partition]), mark.offset,
                )  # fmt: skip

    def _fenced(self, partition) -> None:
        """A partition still assigned here was fenced: the group decides (`rejoin`)."""
        if self._consumer is not None:
            rejoin(self._consumer, partition)

    def settling(self, partition) -> bool:
        """Whether the partition's position is still being set (`assigned`)."""
        return self._producers.settling(partition)

    async def revoked(self, consumer, partitions) -> None:
        await self._producers.close(partitions)
        for partition in partitions:
            self._skip.pop(partition, None)
            self._reserved.pop(partition, None)
        async with self._moved:
            self._moved.notify_all()

    def replayed(self, partition, message) -> bool:
        """Whether the message was answered in a committed transaction above its prefix."""
        return message.offset in self._skip.get(partition, ())

    async def commit(self, consumer, partitions=None) -> None:
        """Nothing: each transaction committed its offset."""

    async def publish(self, partition, message, sends: list[Send], stalled) -> None:
        await self._publish(partition, message.offset, sends, stalled)

    async def _publish(self, partition, offset: int, sends: list[Send], stalled) -> None:
        """Publish `sends` and commit `offset` as finished, in one transaction; `offset`
        is marked finished in the book once committed. Raises `Fenced` if the partition
        is gone, `Refused` if the broker refused a message for good (nothing published)."""
        reserved = await self._room(partition, offset)
        try:
            await self._producers.transact(partition, sends, lambda: self._at(partition, offset),
                                           stalled)  # fmt: skip
            self._book.finish(partition, offset)
            self._book.committable([partition])
        finally:
            if reserved and self._reserved[partition] > 0:
                self._reserved[partition] -= 1
            async with self._moved:
                self._moved.notify_all()

    async def dead_letter(self, message, topic: str, reason: str, stalled) -> bool | None:
        """Dead-letter the relQuery `message` to `topic` in its offset's transaction (or,
        refused, without the original's bytes); False (counted in `LOST_LETTERS`) if the
        broker refuses both for good, its offset then committed without a letter: nothing
        may hold a partition for ever. None if the partition is no longer ours."""
        partition = TopicPartition(message.topic, message.partition)
        letter, what = dead_letter_of(message, reason)

        async def publish(sends: list[Send]) -> None:
            await self._publish(partition, message.offset, sends, stalled)

        try:
            if await publish_letter(letter, what, topic, publish):
                return True
            await publish([])  # refused for good: the offset goes on without it
            return False
        except Fenced as exc:
            log.info("left %s to its partition's new owner (%s)", what, exc)
            return None

    async def _room(self, partition, offset: int) -> bool:
        """Wait while `offset` would be the `MAX_AHEAD`-th finished above its prefix;
        returns whether it took one of those slots."""

        def room() -> bool:
            if not self._producers.owns(partition):
                return True  # `transact` raises Fenced
            return self._book.may_finish(partition, offset, self._reserved[partition])

        async with self._moved:
            await self._moved.wait_for(room)
        if self._book.is_prefix(partition, offset):
            return False
        self._reserved[partition] += 1
        return True

    def _at(self, partition, offset: int) -> tuple[int, str]:
        """The offset commit of a transaction finishing `offset`: its next offset and, as
        metadata, the offsets finished above it."""
        if not self._book.unfinished(partition, offset):  # revoked, or handed back and
            raise Fenced(f"{partition}@{offset} is not this work's")  # answered since
        first, ahead = self._book.progress(partition, offset)
        return first, encode_ahead(ahead, first)

    async def stop(self) -> None:
        await self._producers.close_all()


class AtLeastOnce:
    """Without transactions: answers published until the broker has them, then their
    offsets finished; the consumer commits the finished prefix."""

    def __init__(self, book: OffsetBook, producer, stall_s: float) -> None:
        self._book = book
        self._producer = producer
        self._stall_s = stall_s
        self._published = PublishedOffsets()  # answered, maybe not committed

    def replayed(self, partition, message) -> bool:
        return (partition, message.offset, message.key) in self._published

    async def publish(self, partition, message, sends: list[Send], stalled) -> None:
        await publish_sends(self._producer, sends, stalled, self._stall_s)
        self._finished(partition, message)

    async def dead_letter(self, message, topic: str, reason: str, stalled) -> bool:
        delivered = await send_dead_letter(self._producer, topic, message, reason, stalled)
        self._finished(TopicPartition(message.topic, message.partition), message)
        return delivered

    def _finished(self, partition, message) -> None:
        self._book.finish(partition, message.offset)
        self._published.add(partition, message.offset, message.key)

    async def commit(self, consumer, partitions=None) -> None:
        committed = await commit_assigned(consumer, self._book.committable(partitions))
        self._published.committed(committed)

    async def assigned(self, consumer, partitions) -> None:
        """Nothing: new partitions start from their committed offsets."""

    def settling(self, partition) -> bool:
        return False

    async def revoked(self, consumer, partitions) -> None:
        await self.commit(consumer, partitions)

    async def stop(self) -> None:
        """Nothing to stop: the service's producer is its own."""


__all__ = ["AtLeastOnce", "ExactlyOnce", "Fenced"]
