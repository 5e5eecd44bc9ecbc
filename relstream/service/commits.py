"""How the engine commits what it answered, through the one delivery layer
(`kafka.delivery.outputs`): exactly once where the broker has transactions (`ExactlyOnce`, over
`Transacted`), at least once elsewhere (`AtLeastOnce`, over `Acked`). Both publish a
relQuery's answer (result parts or dead letter), mark its offset finished, say whether a
message was already answered, and follow the partitions' assignment.

A relQuery's result (all its parts) or its dead letter, and its partition's offset, are
committed in one transaction, so a `read_committed` reader sees exactly one result per
relQuery whatever is killed or rebalanced: an engine that dies mid-transaction leaves
nothing visible, and the partition's next owner, whose producer fences the old one,
answers it again.

The engine answers a partition's relQueries out of order, but an offset commit is a
prefix. So each commit carries the offsets finished above its prefix in its metadata
(`offsets.encode_ahead`); the next owner reads them back on assignment and skips them.
At most `offsets.MAX_AHEAD` are carried: a result further ahead of its prefix waits until
the prefix moves (slots are reserved before the transaction, so concurrent results
cannot overshoot).

Without transactions (Tansu refuses `InitProducerId`) the engine runs at least once: each
answer is published until the broker has it, then its offset is finished, and the
consumer commits the finished prefix. A partition handed back replays what was answered
and not yet committed; those are skipped, known by offset and relQuery id (offsets
repeat after a broker restarts empty).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

from aiokafka import TopicPartition

from relstream.kafka.clients.aio import commit_assigned
from relstream.kafka.delivery.letters import Part, dead_letter_of, deliver_letter
from relstream.kafka.delivery.outputs import Acked, Transacted
from relstream.kafka.delivery.publish import Send
from relstream.kafka.delivery.txfaults import Fenced
from relstream.service.offsets import OffsetBook, PublishedOffsets, decode_ahead, encode_ahead

log = logging.getLogger("relstream.engine")


def said_assigned(partitions, took_s: float) -> None:
    """One line per assignment: which partitions this engine now serves (and how long
    taking them over took), so a partition nobody serves can be found in the logs."""
    if partitions:
        numbers = sorted(p.partition for p in partitions)
        log.info("partitions assigned: %s (taken over in %.1f s)", numbers, took_s)


def result_parts(topic: str, relquery_id: str, chunks: list[bytes], headers, instead) -> list[Part]:
    """A relQuery's result in its parts (each under the request limit), keyed by its id;
    they stand or fall together: one refused for good, `instead` replaces them all."""
    return [
        Part(Send(topic, chunk, relquery_id.encode(),
                  f"the result of {relquery_id} (part {index + 1} of {len(chunks)})", headers),
             instead, whole=relquery_id)
        for index, chunk in enumerate(chunks)
    ]  # fmt: skip


class ExactlyOnce:
    """Transactional commits of the partitions the engine owns."""

    def __init__(self, outputs: Transacted, book: OffsetBook) -> None:
        self._outputs = outputs
        self._book = book
        self._skip: dict[object, frozenset[int]] = {}  # finished above the commit read
        self._reserved: Counter = Counter()  # results on their way above each prefix
        self._moved = asyncio.Condition()  # a prefix moved, or a partition left

    async def assigned(self, consumer, partitions) -> None:
        """Fence the partitions' previous owners and seek each to where they left off
        (`PartitionProducers.take_over`); the offsets finished above a committed offset
        are to be skipped."""
        began = time.monotonic()
        marks = await self._outputs.assigned(consumer, partitions)
        said_assigned(partitions, time.monotonic() - began)
        for partition, mark in marks.items():
            self._skip[partition] = decode_ahead(mark.metadata, mark.offset)
            if self._skip[partition]:
                log.info(
                    "%s: %d relQueries above offset %d were answered by its previous owner",
                    partition, len(self._skip[partition]), mark.offset,
                )  # fmt: skip

    def settling(self, partition) -> bool:
        """Whether the partition's position is still being set (`assigned`)."""
        return self._outputs.settling(partition)

    async def revoked(self, consumer, partitions) -> None:
        await self._outputs.revoked(partitions)
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

    async def publish(self, partition, message, parts: list[Part], stalled, lease: int) -> None:
        """Publish `parts` and commit the message's offset as finished, in one
        transaction; the offset is marked finished in the book once committed. A part
        the broker refuses for good is replaced (`kafka.delivery.letters`). Raises `Fenced` if the
        partition is gone, or was handed back since the work was read (its `lease`)."""
        offset = message.offset
        reserved = await self._room(partition, offset)
        try:
            at = lambda: self._at(partition, offset, lease)  # noqa: E731
            await self._outputs.deliver(partition, parts, at, stalled)
            self._book.finish(partition, offset, lease)
            self._book.committable([partition])
        finally:
            if reserved and self._reserved[partition] > 0:
                self._reserved[partition] -= 1
            async with self._moved:
                self._moved.notify_all()

    async def dead_letter(
        self, message, topic: str, reason: str, stalled, row_keys=None, lease: int = 0
    ) -> bool | None:
        """Dead-letter the relQuery `message` to `topic` in its offset's transaction (or,
        refused, without the original's bytes); False (counted in `LOST_LETTERS`) if the
        broker refuses both for good, its offset then committed without a letter: nothing
        may hold a partition for ever. None if the partition is no longer ours."""
        partition = TopicPartition(message.topic, message.partition)
        letter, what = dead_letter_of(message, reason, row_keys)
        try:
            return await deliver_letter(
                topic, letter, what,
                lambda parts: self.publish(partition, message, parts, stalled, lease),
            )  # fmt: skip
        except Fenced as exc:
            log.info("left %s to its partition's new owner (%s)", what, exc)
            return None

    async def _room(self, partition, offset: int) -> bool:
        """Wait while `offset` would be the `MAX_AHEAD`-th finished above its prefix;
        returns whether it took one of those slots."""

        def room() -> bool:
            if not self._outputs.owns(partition):
                return True  # `deliver` raises Fenced
            return self._book.may_finish(partition, offset, self._reserved[partition])

        async with self._moved:
            await self._moved.wait_for(room)
        if self._book.is_prefix(partition, offset):
            return False
        self._reserved[partition] += 1
        return True

    def _at(self, partition, offset: int, lease: int) -> tuple[int, str]:
        """The offset commit of a transaction finishing `offset`: its next offset and, as
        metadata, the offsets finished above it. Asked inside the transaction, with the
        partition's producer: work of an ended assignment aborts it (`Fenced`)."""
        if not self._book.unfinished(partition, offset, lease):  # revoked, handed back,
            raise Fenced(f"{partition}@{offset} is not this work's")  # or answered since
        first, ahead = self._book.progress(partition, offset)
        return first, encode_ahead(ahead, first)

    async def stop(self) -> None:
        await self._outputs.stop()


class AtLeastOnce:
    """Without transactions: answers published until the broker has them, then their
    offsets finished; the consumer commits the finished prefix."""

    def __init__(self, outputs: Acked, book: OffsetBook) -> None:
        self._outputs = outputs
        self._book = book
        self._published = PublishedOffsets()  # answered, maybe not committed

    def replayed(self, partition, message) -> bool:
        return (partition, message.offset, message.key) in self._published

    async def publish(self, partition, message, parts: list[Part], stalled, lease: int) -> None:
        await self._outputs.deliver(partition, parts, None, stalled)
        self._finished(partition, message, lease)

    async def dead_letter(
        self, message, topic: str, reason: str, stalled, row_keys=None, lease: int = 0
    ) -> bool:
        partition = TopicPartition(message.topic, message.partition)
        letter, what = dead_letter_of(message, reason, row_keys)
        return await deliver_letter(
            topic, letter, what,
            lambda parts: self.publish(partition, message, parts, stalled, lease),
        )  # fmt: skip

    def _finished(self, partition, message, lease: int) -> None:
        self._book.finish(partition, message.offset, lease)
        self._published.add(partition, message.offset, message.key)

    async def commit(self, consumer, partitions=None) -> None:
        committed = await commit_assigned(consumer, self._book.committable(partitions))
        self._published.committed(committed)

    async def assigned(self, consumer, partitions) -> None:
        """Nothing but said: new partitions start from their committed offsets."""
        said_assigned(partitions, 0.0)

    def settling(self, partition) -> bool:
        return False

    async def revoked(self, consumer, partitions) -> None:
        await self.commit(consumer, partitions)

    async def stop(self) -> None:
        """Nothing to stop: the service's producer is its own."""


__all__ = ["AtLeastOnce", "ExactlyOnce", "Fenced", "result_parts"]
