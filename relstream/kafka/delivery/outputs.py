"""One delivery layer for every task that reads a partition and publishes what it read
into: the worker's window stage (a window's relQuery, its rows' dead letters) and the
engine (a relQuery's result or dead letter). As Kafka Streams' `StreamsProducer` serves
every task, each fix to delivery is made once, here.

A step's output is a list of `Part`s (`kafka.delivery.letters`: what replaces one the broker
refuses for good) and a mark, the input offset (and metadata) it finishes. `open_outputs`
asks the broker once whether it has transactions and says in one log line what follows:

- `Transacted`: exactly once. The parts and the mark in one transaction of the input
  partition's producer (`kafka.delivery.transactions`), so a `read_committed` reader sees each
  output once whatever is killed, cut or rebalanced; `deliver` raises `Fenced` once the
  partition is not this process's (fenced, revoked): its new owner does the work again.
- `Acked`: at least once (Tansu refuses `InitProducerId`, or transactions are off). Each
  part sent until the broker has it (`publish_acked`); the caller commits the mark with
  its consumer afterwards, so nothing is committed before its output is on the broker.

Both follow the partitions' assignment the same way: `assigned` (a take-over: fencing the
previous owner and reading its committed marks), `revoked`, `settling`, `stop`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer, TopicPartition

from relstream.kafka.clients.security import KafkaSecurity
from relstream.kafka.delivery.letters import Part, deliver_parts
from relstream.kafka.delivery.publish import STALL_S, publish_sends
from relstream.kafka.delivery.transactions import PartitionProducers
from relstream.kafka.delivery.txfaults import Fenced
from relstream.kafka.delivery.txprobe import has_transactions

Mark = Callable[[], tuple[int, str]]  # the offset a step finishes and its metadata


class Transacted:
    """Exactly once: each step's parts and mark in one transaction of its partition."""

    exactly_once = True

    def __init__(self, producers: PartitionProducers) -> None:
        self.producers = producers

    async def deliver(
        self, partition: TopicPartition, parts: list[Part], mark: Mark, stalled
    ) -> list[Part]:
        """Publish `parts` and commit `mark()` (asked under the partition's lock) in one
        transaction, retried until the broker commits it, refused parts replaced; the
        parts published. Raises `Fenced` once the partition is not ours: nothing of it
        committed here."""

        async def transact(sends) -> None:
            await self.producers.transact(partition, sends, mark, stalled)

        return await deliver_parts(parts, transact)

    async def assigned(self, consumer, partitions) -> dict:
        """Fence the previous owners and seek each partition to its committed mark
        (`PartitionProducers.take_over`); the marks, by partition."""
        return await self.producers.take_over(consumer, partitions)

    async def revoked(self, partitions) -> None:
        await self.producers.close(partitions)

    def settling(self, partition) -> bool:
        return self.producers.settling(partition)

    def owns(self, partition) -> bool:
        return self.producers.owns(partition)

    async def stop(self) -> None:
        await self.producers.close_all()


class Acked:
    """At least once: each part sent until the broker has it; the caller's consumer
    commits the mark after."""

    exactly_once = False

    def __init__(self, producer: AIOKafkaProducer, stall_s: float = STALL_S) -> None:
        self._producer = producer
        self._stall_s = stall_s

    async def deliver(
        self, partition: TopicPartition, parts: list[Part], mark: Mark | None, stalled
    ) -> list[Part]:
        """Each part (or what replaces it, refused) on the broker, side by side; the
        parts published."""

        async def one(part: Part) -> list[Part]:
            return await deliver_parts(
                [part], lambda sends: publish_sends(self._producer, sends, stalled, self._stall_s)
            )

        return [sent for each in await asyncio.gather(*map(one, parts)) for sent in each]

    async def assigned(self, consumer, partitions) -> dict:
        """Nothing: the consumer starts from the committed offsets itself."""
        return {}

    async def revoked(self, partitions) -> None:
        """Nothing: the producer is the caller's."""

    def settling(self, partition) -> bool:
        return False

    def owns(self, partition) -> bool:
        return True

    async def stop(self) -> None:
        """Nothing to stop: the producer is the caller's."""


Outputs = Transacted | Acked


async def open_outputs(
    who: str,
    what: str,
    *,
    bootstrap: str,
    group: str,
    security: KafkaSecurity,
    producer: AIOKafkaProducer,
    transactions: bool = True,
    on_fenced: Callable[[TopicPartition], None] = lambda partition: None,
    co_partition: bool = False,
    stall_s: float = STALL_S,
    log: logging.Logger = logging.root,
) -> Outputs:
    """`Transacted` where the broker has transactions and `transactions` is on, else
    `Acked` over `producer`; said once in the caller's `log`, naming `who` and `what` it
    publishes. A broker that does not answer the probe is waited for
    (`has_transactions`)."""
    if not transactions:
        log.info("%s: transactions off: at least once (%s keyed by id)", who, what)
        return Acked(producer, stall_s)
    ok, why = await has_transactions(bootstrap, group, security)
    if not ok:
        log.warning(
            "%s: the broker has no transactions (%s): at least once, %s may be published "
            "twice after a crash (keyed by id)", who, why, what,
        )  # fmt: skip
        return Acked(producer, stall_s)
    producers = PartitionProducers(
        bootstrap, group, security, stall_s, on_fenced=on_fenced, co_partition=co_partition
    )
    log.info("%s: exactly once: %s and their offsets in one transaction", who, what)
    return Transacted(producers)


__all__ = ["Acked", "Fenced", "Outputs", "Transacted", "open_outputs"]
