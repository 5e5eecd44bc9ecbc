"""Following the metrics topic into a `LoadBook` (`placement/book.py`): `LoadReader`, a
kafka-python consumer in a daemon thread, for the synchronous client; `AsyncLoadReader`,
aiokafka, for asyncio programs (the worker, the HTTP door). Neither joins a consumer
group: each reads every partition from a little before its end, and the relqueries
topic's partition count again every PARTITIONS_EVERY_S, for the book's check.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

from aiokafka.errors import KafkaError

from relstream.kafka.clients.aio import assign_all, new_consumer
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.supervise import supervised
from relstream.kafka.clients.sync import sync_consumer
from relstream.kafka.clients.topics import Topics
from relstream.placement.book import Demand, LoadBook
from relstream.placement.choice import EXPIRY_S, Choice
from relstream.placement.reports import engines_secret
from relstream.wire import RelQueryMessage

log = logging.getLogger("relstream.placement")  # the book's, rate limited there

LOOKBACK_RECORDS = 500  # a reader starts this far before the metrics topic's end
CATCH_UP_S = 3.0  # a reader reads up to the end, at most this long, before placing
POLL_MS = 200
PARTITIONS_EVERY_S = 30.0  # how often a reader reads the relqueries topic's partitions again


def _start_offsets(starts: dict, ends: dict) -> dict:
    """Where a reader starts: a little before each partition's end, so the engines'
    latest reports are read at once (older ones are ignored as expired)."""
    return {p: max(starts[p], ends[p] - LOOKBACK_RECORDS) for p in starts}


class LoadReader:
    """Follows the metrics topic in a daemon thread (kafka-python, no consumer group) into
    a LoadBook; `partition_for` answers from what it has read so far."""

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        security: KafkaSecurity = PLAINTEXT,
        expiry: float = EXPIRY_S,
        secret: bytes | None = None,
    ) -> None:
        self.book = LoadBook(topics.relqueries, expiry, secret=secret or engines_secret())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._consumer = sync_consumer(bootstrap, security=security, enable_auto_commit=False)
        from relstream.kafka.clients.bounds import partitions

        consumer = self._consumer
        self._relqueries = topics.relqueries
        self._partitions_read = 0.0
        self._read_partitions()
        parts = partitions(consumer, [topics.metrics])
        consumer.assign(parts)
        starts, ends = consumer.beginning_offsets(parts), consumer.end_offsets(parts)
        for partition, offset in _start_offsets(starts, ends).items():
            consumer.seek(partition, offset)
        deadline = time.monotonic() + CATCH_UP_S  # the reports there now, before placing
        while time.monotonic() < deadline and any(consumer.position(p) < ends[p] for p in parts):
            self._take(consumer.poll(timeout_ms=POLL_MS))
        self._thread = threading.Thread(target=self._follow, name="load-reports", daemon=True)
        self._thread.start()

    def _read_partitions(self) -> None:
        """The relqueries topic's partition count, for the book (None where unknown)."""
        self._consumer.topics()  # every topic's metadata, read again now
        found = self._consumer.partitions_for_topic(self._relqueries)
        with self._lock:
            self.book.partitions = len(found) if found else None
        self._partitions_read = time.monotonic()

    def _follow(self) -> None:
        while not self._stop.is_set():
            try:  # whatever fails, it is logged and the thread reads on
                if time.monotonic() - self._partitions_read > PARTITIONS_EVERY_S:
                    self._read_partitions()
                self._take(self._consumer.poll(timeout_ms=POLL_MS))
            except Exception as exc:  # a broker outage: placement falls back to the hash
                log.warning("reading load reports: %r", exc)
                self._stop.wait(1.0)

    def _take(self, batches: dict) -> None:
        with self._lock:
            for records in batches.values():
                for record in records:
                    self.book.take(record.value, record.headers)

    def partition_for(self, message: RelQueryMessage) -> int | None:
        with self._lock:
            return self.book.partition_for(message)

    def engines(self) -> list[str]:
        with self._lock:
            return self.book.engines()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()


class AsyncLoadReader:
    """Follows the metrics topic with aiokafka (no consumer group) into a LoadBook, for
    asyncio programs: `await start()`, then `place(demand_of(relquery))` between awaits,
    the demand computed off the loop; `stop()`."""

    def __init__(
        self,
        bootstrap: str,
        topics: Topics,
        broker_kind: str | None = None,
        security: KafkaSecurity = PLAINTEXT,
        expiry: float = EXPIRY_S,
        secret: bytes | None = None,
    ) -> None:
        self.book = LoadBook(topics.relqueries, expiry, secret=secret or engines_secret())
        self._topic = topics.metrics
        self._client = (bootstrap, broker_kind, security)
        self._consumer = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Read the metrics topic from a little before its end (its consumer is made here:
        aiokafka's needs the running loop)."""
        bootstrap, broker_kind, security = self._client
        consumer = self._consumer = new_consumer(
            bootstrap, broker_kind=broker_kind, security=security
        )
        await consumer.start()
        parts = await assign_all(consumer, self._topic)
        starts, ends = await consumer.beginning_offsets(parts), await consumer.end_offsets(parts)
        for partition, offset in _start_offsets(starts, ends).items():
            consumer.seek(partition, offset)
        await self._read_partitions()
        self._task = asyncio.create_task(supervised("the load reports reader", self._follow))

    async def _read_partitions(self) -> None:
        """The relqueries topic's partition count, for the book (None where unknown)."""
        # Every topic's metadata, read now: the consumer's own holds only the topics it
        # is assigned (aiokafka has no public call for another topic's partitions).
        cluster = await self._consumer._client.fetch_all_metadata()
        found = cluster.partitions_for_topic(self.book.topic)
        self.book.partitions = len(found) if found else None
        self._partitions_read = time.monotonic()

    async def _follow(self) -> None:
        while True:
            try:
                if time.monotonic() - self._partitions_read > PARTITIONS_EVERY_S:
                    await self._read_partitions()
                batches = await self._consumer.getmany(timeout_ms=POLL_MS)
            except KafkaError as exc:  # a broker outage: placement falls back to the hash
                log.warning("reading load reports: %r", exc)
                await asyncio.sleep(1.0)
                continue
            for records in batches.values():
                for record in records:
                    self.book.take(record.value, record.headers)

    def place(self, demand: Demand) -> int | None:
        return self.book.place(demand)

    def pick(self, demand: Demand, prefer: str | None = None) -> Choice | None:
        return self.book.pick(demand, prefer)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()
