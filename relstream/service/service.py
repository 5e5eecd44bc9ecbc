"""`relstream engine`: serve the relqueries topic and publish results.

At-least-once: a relQuery's offset is committed only after its result is published, and
only once every earlier offset of its partition is done, so a crash replays unfinished
work. Results are keyed by relQuery id; consumers de-duplicate on it. In-flight work is
bounded: the consumer pauses while `max_in_flight` relQueries are being served. A message
that cannot be used goes to the dead-letter topic with the reason, and serving goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from relstream.backend import RelQueryBackend
from relstream.kafka.clients import client_settings
from relstream.kafka.topics import Topics
from relstream.model import RelQuery
from relstream.schemas import Message, MessageError, decode_relquery_stepwise, encode
from relstream.schemas.convert import (
    dead_letter_message,
    partial_result_message,
    relquery_from_message,
    result_message,
)
from relstream.service.metrics import EngineMetrics
from relstream.service.offsets import OffsetBook

log = logging.getLogger("relstream.engine")


@dataclass
class ServiceConfig:
    bootstrap: str
    topics: Topics = field(default_factory=Topics)
    group_id: str = "relstream-engine"
    broker: str | None = None  # embedded broker kind, for its client settings
    max_in_flight: int = 8
    partial_results: bool = False
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"


class EngineService:
    def __init__(self, config: ServiceConfig, backend: RelQueryBackend) -> None:
        self.config = config
        self.backend = backend
        self.metrics = EngineMetrics()
        self._book = OffsetBook()
        self._slots = asyncio.Semaphore(config.max_in_flight)
        self._tasks: set[asyncio.Task] = set()
        self._paused = False

    async def run(self, stop: asyncio.Event) -> None:
        from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

        settings = client_settings(self.config.broker)
        self._producer = AIOKafkaProducer(bootstrap_servers=self.config.bootstrap, acks="all")
        self._consumer = AIOKafkaConsumer(
            self.config.topics.relqueries,
            bootstrap_servers=self.config.bootstrap,
            group_id=self.config.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            **settings,
        )
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
        await self._producer.start()
        await self._consumer.start()
        try:
            while not stop.is_set():
                await self._poll_once()
                await self._commit()
        finally:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            # A consumer stuck joining its group (noida-db never evicts a killed member)
            # must not keep the process from stopping; uncommitted work is replayed.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10):
                    await self._commit()
                    await self._consumer.stop()
            await self._producer.stop()

    async def _poll_once(self) -> None:
        full = self._slots.locked()
        if full != self._paused:
            # Only on a change: resuming on every poll restarts fetches in a busy loop.
            assignment = self._consumer.assignment()
            (self._consumer.pause if full else self._consumer.resume)(*assignment)
            self._paused = full
        batches = await self._consumer.getmany(
            timeout_ms=200, max_records=self.config.max_in_flight
        )
        for partition, messages in batches.items():
            for message in messages:
                await self._slots.acquire()
                self._book.start(partition, message.offset)
                task = asyncio.create_task(self._handle(partition, message))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        self.metrics.in_flight.set(len(self._tasks))

    async def _handle(self, partition, message) -> None:
        try:
            try:
                relquery = relquery_from_message(await decode_relquery_stepwise(message.value))
            except MessageError as exc:
                await self._dead_letter(message, exc.reason)
            else:
                await self._serve(relquery)
            self._book.finish(partition, message.offset)
        except Exception:
            # Left uncommitted: this relQuery is served again after a restart.
            log.exception(
                "serving %s[%s]@%s failed", message.topic, message.partition, message.offset
            )
        finally:
            self._slots.release()

    async def _serve(self, relquery: RelQuery) -> None:
        started = time.monotonic()
        handle = await self.backend.submit(relquery)
        if self.config.partial_results:
            async for row in handle.rows():
                partial = partial_result_message(relquery.id, row)
                await self._publish(self.config.topics.partial_results, relquery.id, partial)
        result = await handle.result()
        await self._publish(self.config.topics.results, relquery.id, result_message(result))
        self.metrics.observe_result(result, time.monotonic() - started)

    async def _dead_letter(self, message, reason: str) -> None:
        log.warning(
            "dead-letter %s[%s]@%s: %s", message.topic, message.partition, message.offset, reason
        )
        letter = dead_letter_message(
            message.value, message.topic, message.partition, message.offset, reason
        )
        await self._publish(self.config.topics.deadletter, None, letter, message.key)
        self.metrics.dead_letters.inc()

    async def _publish(
        self, topic: str, key: str | None, payload: Message, raw_key: bytes | None = None
    ) -> None:
        key_bytes = raw_key if raw_key is not None else (key.encode() if key else None)
        await self._producer.send_and_wait(topic, encode(payload), key=key_bytes)

    async def _commit(self) -> None:
        offsets = self._book.committable()
        if offsets:
            await self._consumer.commit(offsets)
