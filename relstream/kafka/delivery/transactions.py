"""Exactly once through the broker's transactions: one transactional producer per input
partition, so a message's output and its partition's offset are committed together.

An input partition's producer has the transactional id `{group}.{topic}.{partition}`.
The owner a rebalance hands the partition to starts a producer with that id, and the
broker aborts the previous owner's open transaction and refuses it any later one
(`ProducerFenced`): a zombie cannot commit, nor commit after its own renewal what the
owner committed (`_check_ours`; aiokafka's `send_offsets_to_transaction` sends no
generation, so the group itself would take a zombie's offsets).

One transaction at a time per partition (a lock), its offset commit computed under it
(`offsets`). One the broker does not take (an outage) is retried with the same messages
by a new producer under the same id while the partition stays assigned; a message
refused for good aborts it (`Refused`). One whose producer lost a connection before the
commit is redone (`BrokerLost`; noida-db forgets an open transaction's partitions at a
restart), a commit going only over the connections it began with (`txfaults.Breaks`). A
commit whose answer was lost is found out from the broker's record (`outcome`), never
guessed. Without transactions (Tansu: `txprobe.has_transactions`), at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import ProducerFenced

from relstream.kafka.clients.aio import new_producer
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.delivery.outcome import (
    Gone,
    Outcome,
    Written,
    find_outcome,
    group_marks,
    mark_moved,
)
from relstream.kafka.delivery.publish import STALL_S, Backoff, Refused, Send
from relstream.kafka.delivery.txfaults import Breaks, BrokerLost, Fenced, Unanswered, refusal
from relstream.kafka.delivery.txprobe import STOP_S, stop_producer

log = logging.getLogger("relstream.kafka.delivery.transactions")

# Kafka aborts a dead writer's open transaction after this; noida-db never (`co_partition`).
TRANSACTION_TIMEOUT_MS = 60_000
# A producer's start (InitProducerId) given up, said and tried anew after this: aiokafka
# asks for ever, silently, its take-over's partition paused meanwhile.
START_S = 30.0


def transactional_id(group: str, partition: TopicPartition) -> str:
    return f"{group}.{partition.topic}.{partition.partition}"


class PartitionProducers:
    """The transactional producers of the input partitions this process owns."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        security: KafkaSecurity = PLAINTEXT,
        stall_s: float = STALL_S,
        backoff: Backoff | None = None,
        on_fenced: Callable[[TopicPartition], None] = lambda partition: None,
        co_partition: bool = False,
    ) -> None:
        self._bootstrap = bootstrap
        # A message with no partition of its own goes to its topic's partition matching
        # its input's (`_target`), as Kafka Streams co-partitions: a writer dead
        # mid-transaction holds back readers of its own partitions only (issue 48).
        self._co_partition = co_partition
        # Called when a partition still assigned here is fenced: some other producer took
        # its id, a zombie's renewal or a rebalance not yet heard of. The caller asks its
        # group (`rejoin`): the group's word decides who owns it, and the new assignment
        # opens a producer again (`open`), fencing a zombie in turn.
        self._on_fenced = on_fenced
        self._group = group
        self._security = security
        self._stall_s = stall_s
        self._backoff = backoff or Backoff()
        self._producers: dict[TopicPartition, AIOKafkaProducer] = {}
        self._breaks: dict[AIOKafkaProducer, Breaks] = {}  # its broken connections
        self._locks: dict[TopicPartition, asyncio.Lock] = {}
        self._settling: set[TopicPartition] = set()  # assigned, their position not yet set
        self._attempts: dict[TopicPartition, asyncio.Future] = {}  # a try in flight
        # The group's mark of each partition as this owner last knew it (read at the
        # take-over, then its own commits): a renewal checks it (`_check_ours`).
        self._known: dict[TopicPartition, tuple[int, str] | None] = {}

    async def take_over(self, consumer, partitions) -> dict:
        """Fence newly assigned `partitions`' previous owners (`open`), then seek each to
        its committed offset (read after the fencing, so final; none: the beginning).
        Returns the committed marks (offset and metadata) of those still assigned. Until
        then the partitions are paused and what the consumer fetched of them is to be
        dropped (`settling`): it may start fetching from the offsets it read itself,
        before the fencing."""
        partitions = list(partitions)
        if not partitions:
            return {}
        self._settling.update(partitions)
        consumer.pause(*partitions)
        try:
            await self.open(partitions)
            committed = await self.committed(partitions, consumer.assignment)
            marks = {}
            for partition in set(partitions) & consumer.assignment():  # not revoked since
                mark = committed.get(partition)
                known = None if mark is None or mark.offset < 0 else mark
                self._known[partition] = known and (known.offset, known.metadata or "")
                if known is None:
                    await consumer.seek_to_beginning(partition)
                    continue
                consumer.seek(partition, mark.offset)
                marks[partition] = mark
            return marks
        finally:
            self._settling.difference_update(partitions)
            consumer.resume(*(set(partitions) & consumer.assignment()))

    def settling(self, partition) -> bool:
        """Whether the partition's position is still being set (`take_over`)."""
        return partition in self._settling

    async def committed(self, partitions, assigned: Callable[[], set]) -> dict:
        """The group's committed marks of `partitions`, asked until the broker answers or
        none of them is `assigned()` here any more: a partition resumed without its mark
        would be read from the consumer's own position, its answered work done again."""
        tries = 0
        while True:
            try:
                return await group_marks(self._bootstrap, self._security, self._group, partitions)
            except Exception as exc:  # the broker did not answer: the partitions stay paused
                if not set(partitions) & assigned():
                    return {}
                tries, parts = tries + 1, sorted(p.partition for p in partitions)
                wait = self._backoff.after(tries)
                log.warning("committed offsets of %s not read (%r): paused, asked again in "
                            "%.1f s", parts, exc, wait)  # fmt: skip
                await asyncio.sleep(wait)

    async def open(self, partitions) -> None:
        """Start the producers of newly assigned `partitions`. Each start fences the
        partition's previous owner and aborts its open transaction, so the committed
        offsets read after this are final."""
        partitions = [p for p in partitions if p not in self._producers]
        for partition in partitions:
            self._locks.setdefault(partition, asyncio.Lock())
        await asyncio.gather(*(self._open(p, self._locks[p]) for p in partitions))

    async def _open(self, partition: TopicPartition, lock: asyncio.Lock) -> None:
        """Start the partition's producer for the ownership `lock` stands for (a
        partition revoked and assigned again has a new lock: an old ownership's renewal
        must not start one for the new)."""
        tries = 0
        while self._locks.get(partition) is lock:
            producer = new_producer(
                self._bootstrap,
                self._security,
                transactional_id=transactional_id(self._group, partition),
                transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            )
            breaks = Breaks(producer)
            try:  # aiokafka asks InitProducerId until answered: bounded here, said, redone
                async with asyncio.timeout(START_S):
                    await producer.start()
            except BaseException as exc:  # cancelled too: never left running
                await stop_producer(producer)
                if not isinstance(exc, Exception):
                    raise
                tries += 1
                log.warning("transactional producer for %s not started (%r)", partition, exc)
                await asyncio.sleep(self._backoff.after(tries))
                continue
            if self._locks.get(partition) is not lock or partition in self._producers:
                await stop_producer(producer)  # revoked meanwhile, or opened already
                return
            self._producers[partition] = producer
            self._breaks[producer] = breaks
            return

    async def close(self, partitions) -> None:
        """Stop the producers of revoked `partitions`, once their transactions end (one
        waiting on the broker gives up: `Fenced`); all at once, so a revocation in an
        outage waits `STOP_S` once, not once a partition."""
        await asyncio.gather(*(self._close(partition) for partition in partitions))

    async def _close(self, partition) -> None:
        producer = self._producers.pop(partition, None)
        lock = self._locks.pop(partition, None)
        try:
            if lock is not None and lock.locked():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(STOP_S):
                        async with lock:
                            pass
                attempt = self._attempts.get(partition)
                if attempt is not None and not attempt.done():
                    attempt.cancel()  # its outcome is the next owner's (`_cancellable`)
        finally:
            if producer is not None:  # None: being renewed, which sees it revoked
                self._breaks.pop(producer, None)
                await stop_producer(producer)

    async def close_all(self) -> None:
        await self.close(list(self._producers))

    def owns(self, partition: TopicPartition) -> bool:
        return partition in self._producers

    async def transact(
        self,
        partition: TopicPartition,
        sends: list[Send],
        offsets: Callable[[], tuple[int, str]],
        stalled: Callable[[], None] = lambda: None,
    ) -> None:
        """Publish `sends` and commit `partition` to `offsets()` (the next offset and its
        metadata, asked under the partition's lock) in one transaction, retried until the
        broker commits it. Raises `Fenced` once the partition is not ours, `Refused` if
        the broker refuses a message for good (the transaction aborted)."""
        lock = self._locks.get(partition)
        if lock is None:
            raise Fenced(f"{partition} is not assigned here")
        timer = asyncio.get_running_loop().call_later(self._stall_s, stalled)
        tries, verify = 0, False
        try:
            async with lock:
                while True:
                    producer = self._producers.get(partition)
                    if producer is None or self._locks.get(partition) is not lock:
                        # revoked, or revoked and assigned here again: a try of the old
                        # ownership must not commit with the new one's producer
                        raise Fenced(f"{partition} was revoked")
                    tries += 1
                    try:
                        if verify:  # renewed after a failure: is the partition still ours?
                            await self._check_ours(partition, lock)
                            verify = False
                        await self._cancellable(
                            partition, self._once(producer, partition, sends, offsets)
                        )
                        return
                    except ProducerFenced as exc:
                        await self._drop(partition, producer)
                        if partition in self._locks:  # ours, as far as the group said
                            self._on_fenced(partition)
                        raise Fenced(f"{partition}: {exc}") from exc
                    except Refused:
                        # Aborted by a new producer under the id, not `abort_transaction`:
                        # after a refused batch the sequence numbers no longer match the
                        # broker's, and the next transaction failed on every message
                        # (`OutOfOrderSequenceNumber` after a `MessageSizeTooLarge`).
                        await self._renew(partition, producer, lock)
                        raise
                    except Fenced:  # `offsets` found the partition forgotten
                        raise
                    except Unanswered as cut:
                        outcome = await self._cancellable(
                            partition, self._settle(partition, producer, lock, cut)
                        )
                        if outcome.landed and not outcome.missing:
                            self._known[partition] = cut.mark
                            return
                        if outcome.landed:  # only what it lost, under the same mark
                            sends, offsets = list(outcome.missing), lambda m=cut.mark: m
                        else:  # redone whole, after the backoff an outage gets
                            stalled()
                            await asyncio.sleep(self._backoff.after(tries))
                    except Exception as exc:  # an outage, or a producer in a bad state
                        stalled()
                        wait = self._backoff.after(tries)
                        log.warning(
                            "transaction for %s not committed (%r); retried in %.1f s",
                            partition, exc, wait,
                        )  # fmt: skip
                        await self._renew(partition, producer, lock)
                        await asyncio.sleep(wait)
                        verify = True
        finally:
            timer.cancel()

    async def _check_ours(self, partition, lock) -> None:
        """After a renewal: a process rebalanced away unknowingly (a zombie) renews too,
        fencing the owner, and would commit what the owner committed. A group mark moved
        since this one's last: dropped, the group asked (`rejoin`), `Fenced`."""
        known = self._known.get(partition, False)
        moved = known is not False and self._locks.get(partition) is lock and await mark_moved(
            self._bootstrap, self._security, self._group, partition, known)  # fmt: skip
        if moved:
            if (current := self._producers.get(partition)) is not None:
                await self._drop(partition, current)
            self._on_fenced(partition)
            raise Fenced(f"{partition}: another owner committed since this one's last commit")

    async def _cancellable(self, partition, work):
        """`work` (a try, `_once`, or finding out its outcome, `_settle`) as a task
        `close` can cut: a partition revoked while its commit hangs, or while its outcome
        is looked up, is not held for ever: after `STOP_S` the work is cancelled and
        `Fenced` raised, so its caller releases it. Its outcome is then the next owner's
        to settle (its producer fences this one; it reads the committed offset)."""
        attempt = asyncio.ensure_future(work)
        self._attempts[partition] = attempt
        try:
            return await attempt
        except asyncio.CancelledError:
            if attempt.cancelled() and not asyncio.current_task().cancelling():
                raise Fenced(f"{partition} was revoked mid-commit") from None
            raise
        finally:
            if self._attempts.get(partition) is attempt:
                del self._attempts[partition]

    async def _once(self, producer, partition, sends: list[Send], offsets) -> None:
        """One try. A connection that broke before the commit, or since the producer
        started (noida-db forgets its fencing when it restarts: a zombie's old producer
        committed): `BrokerLost`, renewed and redone. A commit whose answer was lost:
        `Unanswered`."""
        breaks = self._breaks[producer]
        if breaks():  # so, from here, any break is one during this transaction
            raise BrokerLost("its connection broke since its producer started")
        # Asked first: `Fenced` from it (the work is no longer this owner's) must not
        # leave a transaction open on a producer that stays, holding back every
        # `read_committed` reader of the partitions it wrote until the next try renews it.
        mark = offsets()
        await producer.begin_transaction()
        sent = []
        for send in sends:  # a message over the producer's own limit is refused here
            with refusal(send):
                to = await self._target(producer, send, partition)
                sent.append((send, await producer.send(
                    send.topic, send.value, send.key, to, headers=send.headers
                )))  # fmt: skip
        written = []
        for send, future in sent:
            with refusal(send):
                at = await future
            written.append(Written(send, TopicPartition(at.topic, at.partition), at.offset))
        await producer.send_offsets_to_transaction({partition: mark}, self._group)
        if breaks():
            raise BrokerLost("its connection broke before the commit")
        try:
            with breaks.commit_unbroken():
                await producer.commit_transaction()
        except ProducerFenced:
            raise
        except Exception as exc:  # sent, no answer: outcome unknown
            raise Unanswered(f"the commit raised {exc!r}", mark, written) from exc
        if breaks.turned:  # a connection broke: sent again as an abort; the first?
            raise Unanswered("its connection broke: the commit ended as an abort", mark, written)
        self._known[partition] = tuple(mark)
        if breaks():  # the broker answered: the commit is its, the messages?
            raise Unanswered("its connection broke during the commit", mark, written, answered=True)

    async def _target(self, producer, send: Send, partition: TopicPartition) -> int | None:
        """The partition `send` goes to: its own, else (co-partitioned) the one of its topic
        numbered as the input's, modulo the topic's partitions; else None (its key's)."""
        if send.partition is not None or not self._co_partition:
            return send.partition
        numbers = sorted(await producer.partitions_for(send.topic))
        return numbers[partition.partition % len(numbers)]

    async def _settle(self, partition, producer, lock, cut: Unanswered) -> Outcome:
        """After `Unanswered`: what became of the transaction, from the broker's record
        (`find_outcome`). The producer is renewed first: the new one waits for the cut
        transaction to end or aborts it, so the record read after is final."""
        log.warning("transaction for %s: %s; finding out whether it landed", partition, cut)
        await self._renew(partition, producer, lock)
        try:
            return await find_outcome(
                self._bootstrap, self._group, partition, cut.mark, cut.written,
                lambda: self._locks.get(partition) is lock, self._security, self._backoff,
                answered=cut.answered,
            )  # fmt: skip
        except Gone as exc:  # revoked, or committed past by another owner: a zombie's
            current = self._producers.get(partition)
            if current is not None:
                await self._drop(partition, current)
            if self._locks.get(partition) is lock:  # still ours, as far as we know
                self._on_fenced(partition)  # the group decides (`rejoin`)
            raise Fenced(str(exc)) from exc

    async def _renew(self, partition, producer, lock) -> None:
        """Replace a producer whose transaction failed: the new one, same id, aborts it.
        Not once the partition is revoked (the new owner's producer would be fenced)."""
        if self._producers.get(partition) is not producer:
            return
        del self._producers[partition]
        self._breaks.pop(producer, None)
        await stop_producer(producer)
        await self._open(partition, lock)  # nothing, once revoked

    async def _drop(self, partition, producer) -> None:
        if self._producers.get(partition) is producer:
            del self._producers[partition]
        self._breaks.pop(producer, None)
        await stop_producer(producer)
