"""The HTTP door's placement (docs/operations.md, Scale-out): a relQuery POSTed to the door of an
engine that serves Kafka and reports its load goes where the worker and the Python client
would send it, the engine with the least outstanding work (`relstream.placement`).

The door keeps it where placement cannot tell (no fresh report), where this engine is
within the placement margin of the least (no needless Kafka hop), and where it cannot be
forwarded: streamed requests (an engine publishes partial results only with
`--partial-results`, and best effort, so rows could not be streamed faithfully), a message
over the producer's request limit, or one the broker refuses. Otherwise it is published,
acknowledged, to a partition of the chosen engine, and its result is read back from the
results topic: the same message the engine publishes for every relQuery, returned as the
door's own JSON. How many the door awaits at once is bounded by what it admits
(`service/doorlimits.py`).

Forwarding loses and doubles nothing: the relQuery is written once, to one partition,
and answered there at least once as any relQuery on Kafka; the door answers its client
with the first whole result under its id. A relQuery dead-lettered where it went is a
502; no result within its deadline (else FORWARD_WAIT_S) is a 504, and the door then
cancels it on the control topic. A DELETE cancels it there too, and so does its client's
leaving: the door cancels the task awaiting its answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

import msgspec
from aiokafka.errors import KafkaError

from relstream.kafka.clients.aio import MAX_REQUEST_BYTES, assign_all, new_consumer, new_producer
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.supervise import supervised
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.publish import Refused, publish_acked
from relstream.placement.book import Demand, demand_of, placement_of
from relstream.placement.readers import AsyncLoadReader
from relstream.wire import (
    ControlMessage,
    DeadLetterMessage,
    MessageError,
    RelQueryMessage,
    ResultMessage,
    encode,
)
from relstream.wire.formats import decode_record
from relstream.wire.parts import ResultJoiner

log = logging.getLogger("relstream.forward")

FORWARD_WAIT_S = 300.0  # the longest the door awaits a forwarded result without a deadline
CANCEL_S = 10.0  # the longest the door tries to cancel what it waited for in vain


class NotAnswered(Exception):
    """A forwarded relQuery's client gets no result: `status` and why."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class _Waiter:
    """A forwarded relQuery awaiting its result, and the parts of it read so far."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[ResultMessage] = asyncio.get_running_loop().create_future()
        self.parts = ResultJoiner()


class ResultFollower:
    """One consumer (no group) over the results and dead-letter topics, each partition
    assigned from its end when the door starts, before anything is forwarded. It decodes
    only the records whose key a waiter awaits and skips the rest unread, so what it holds
    is bounded by the door's waiters (its admission bound) and their results' parts."""

    def __init__(self, bootstrap: str, topics: Topics, broker_kind: str | None,
                 security: KafkaSecurity) -> None:  # fmt: skip
        self._topics = topics
        self._consumer = new_consumer(bootstrap, broker_kind=broker_kind, security=security)
        self._waiters: dict[bytes, _Waiter] = {}
        self._task: asyncio.Task | None = None
        self.following = False  # the results topic's partitions are followed

    async def start(self) -> None:
        consumer = self._consumer
        await consumer.start()
        parts = await assign_all(consumer, self._topics.results, self._topics.deadletter)
        self.following = any(part.topic == self._topics.results for part in parts)
        if not self.following:  # its result could never be read back: serve here
            log.warning("no topic %s: the HTTP door serves every relQuery itself",
                        self._topics.results)  # fmt: skip
        for partition, end in (await consumer.end_offsets(parts)).items():
            consumer.seek(partition, end)
        # restarted if it dies: waiters would otherwise wait out their deadline for nothing
        self._task = asyncio.create_task(supervised("the door's results follower", self._follow))

    def __len__(self) -> int:
        return len(self._waiters)

    def __contains__(self, relquery_id: str) -> bool:
        return relquery_id.encode() in self._waiters

    def expect(self, relquery_id: str) -> asyncio.Future[ResultMessage]:
        """The future of this relQuery's whole result (or its dead letter's error)."""
        waiter = self._waiters[relquery_id.encode()] = _Waiter()
        return waiter.answer

    def forget(self, relquery_id: str) -> None:
        self._waiters.pop(relquery_id.encode(), None)

    async def _follow(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=200)
            except KafkaError as exc:  # a broker outage: waiters keep waiting, up to theirs
                log.warning("reading results: %r", exc)
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for record in records:
                    await self.take(record)

    async def take(self, record) -> None:
        """A results or dead-letter record: decoded only if a waiter awaits its key, and
        handed to it once its result is whole (or as a 502 if it is its dead letter)."""
        waiter = self._waiters.get(record.key or b"")
        if waiter is None or waiter.answer.done():
            return
        try:
            if record.topic == self._topics.deadletter:
                letter = decode_record(DeadLetterMessage, record.value, record.headers)
                if letter.topic == self._topics.relqueries:
                    reason = f"the engine it was sent to dead-lettered it: {letter.reason}"
                    waiter.answer.set_exception(NotAnswered(502, reason))
                return
            part = await asyncio.to_thread(
                decode_record, ResultMessage, record.value, record.headers
            )
        except MessageError as exc:
            log.warning("ignored %s[%s]@%s: %s", record.topic, record.partition,
                        record.offset, exc.reason)  # fmt: skip
            return
        whole = waiter.parts.add(part)
        if whole is not None and not waiter.answer.done():
            waiter.answer.set_result(whole)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._consumer.stop()


def _weighed(message: RelQueryMessage) -> tuple[Demand, bytes]:
    """What placing the relQuery weighs, and its message as the engines read it: walks
    over every row, so it runs in a thread. It is submitted now, as the door takes it
    (the door's own answers count from then too), so its result's `queued` is its time
    in Kafka, not the client's clock."""
    sent = msgspec.structs.replace(message, submitted_at=time.time())
    return demand_of(sent), encode(sent)


class DoorPlacement:
    """Places the door's relQueries as the worker does, on behalf of `engine` (the name
    its load reports carry): `answer(message)` is the result JSON of one served where
    placement sends it, or None to serve it here."""

    def __init__(self, bootstrap: str, topics: Topics, engine: str,
                 broker_kind: str | None = None, security: KafkaSecurity = PLAINTEXT,
                 wait_s: float = FORWARD_WAIT_S) -> None:  # fmt: skip
        self.engine = engine
        self.topics = topics
        self.wait_s = wait_s
        self.reader = AsyncLoadReader(bootstrap, topics, broker_kind, security)
        self.results = ResultFollower(bootstrap, topics, broker_kind, security)
        self._producer = new_producer(bootstrap, security)

    async def start(self) -> None:
        """Start its producer, results follower and load reader; what started is stopped
        again if a later one fails."""
        try:
            await self._producer.start()
            await self.results.start()
            await self.reader.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self.reader.stop()
        await self.results.stop()
        await self._producer.stop()

    def forwarded(self, relquery_id: str) -> bool:
        """Whether the door awaits this relQuery from another engine."""
        return relquery_id in self.results

    async def answer(self, message: RelQueryMessage) -> bytes | None:
        if not self.results.following:
            return None
        demand, value = await asyncio.to_thread(_weighed, message)
        if len(value) > MAX_REQUEST_BYTES:
            return None
        if message.id in self.results:  # sent twice at once
            raise NotAnswered(409, f"relQuery {message.id!r} is already being served")
        choice = self.reader.pick(demand, prefer=self.engine)
        if choice is None or choice.engine == self.engine:
            return None
        wait_s = message.deadline_s or self.wait_s
        answer = self.results.expect(message.id)  # before it is sent: no result is missed
        sent = False  # from its first try on: it may be on the broker
        try:
            async with asyncio.timeout(wait_s):
                what = f"relQuery {message.id} (forwarded to {choice.engine})"
                try:
                    sent = True
                    await publish_acked(self._producer, self.topics.relqueries, value,
                                        demand.key, what, partition=choice.partition)  # fmt: skip
                except Refused as exc:  # nothing is on the broker: served here
                    log.warning("%s; serving it here", exc)
                    return None
                result = await answer
        except TimeoutError:
            await self._cancel_quietly(message.id)
            raise NotAnswered(
                504,
                f"no result for relQuery {message.id!r} from engine {choice.engine} within "
                f"{wait_s:g} s; the door asked to cancel it",
            ) from None
        except asyncio.CancelledError:  # its client went away: cancelled where it went
            if sent:  # in a task of its own, which this one's cancellation does not reach
                await asyncio.shield(self._cancel_quietly(message.id))
            raise
        finally:
            self.results.forget(message.id)
        log.info("answered %s through engine %s", message.id, choice.engine)
        return await asyncio.to_thread(msgspec.json.encode, result)

    async def _cancel_quietly(self, relquery_id: str) -> None:
        with contextlib.suppress(TimeoutError, Refused):  # best effort: it may be done
            async with asyncio.timeout(CANCEL_S):
                await self.cancel(relquery_id)

    async def cancel(self, relquery_id: str) -> None:
        """Ask the engines, on the control topic, to stop it: the one serving it does, or
        remembers it for when it is taken."""
        value = encode(ControlMessage(cancel=relquery_id))
        what = f"the cancel of {relquery_id}"
        await publish_acked(self._producer, self.topics.control, value, None, what)


def door_placement(config, engine: str) -> DoorPlacement | None:
    """The door's placement beside the engine service of `config` named `engine`; None
    where its engine reports no load (no other placer would send it work either) or
    `RELSTREAM_PLACEMENT=hash`."""
    if config.load_report_s <= 0 or placement_of(None) != "load":
        return None
    placement = DoorPlacement(config.bootstrap, config.topics, engine, config.broker,
                              config.security)  # fmt: skip
    if config.answer_secret:  # the engines' secret, from --answer-secret-file
        placement.reader.book.secret = config.answer_secret
    return placement
