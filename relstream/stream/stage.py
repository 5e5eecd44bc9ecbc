"""One registration's window stage: its rows topic → windows → the relqueries topic.

It reads whole batches of records (per-event handling was what held the worker to
~7,000 rows/s), cuts each input partition into windows (`windowing.PartitionWindows`),
publishes a window's relQuery, and only once the broker has it commits the partition up
to the start of the window still open. A crashed worker therefore replays from there
and cuts the same windows under the same ids. Each registration reads with its own
consumer group, so registrations over one table keep their own offsets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiokafka import TopicPartition

from relstream.kafka.clients import (
    RevocationListener,
    commit_assigned,
    new_consumer,
    new_producer,
    portable_session,
    send_dead_letter,
    start_all,
)
from relstream.kafka.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.topics import Topics
from relstream.schemas import encode
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import (
    PartitionWindows,
    RowRejection,
    Window,
    check_row,
    relquery_for_window,
)

log = logging.getLogger("relstream.worker")

BATCH_RECORDS = 10_000  # records taken per fetch
POLL_MS = 100  # how long a fetch waits for records; also how often windows expire


@dataclass(frozen=True)
class StageSettings:
    bootstrap: str
    topics: Topics
    group: str  # this registration's consumer group
    broker_kind: str | None = None
    security: KafkaSecurity = PLAINTEXT
    lateness: float = 1.0  # seconds past a window's deadline before it closes live


class WindowStage:
    def __init__(self, registration: QueryRegistration, settings: StageSettings) -> None:
        self.registration = registration
        self.settings = settings
        self._cutters: dict[TopicPartition, PartitionWindows] = {}
        self._committed: dict[TopicPartition, int] = {}
        self.rows_seen = 0
        self.ready = asyncio.Event()  # set once it reads its rows topic

    async def run(self) -> None:
        """Window rows until cancelled."""
        settings = self.settings
        self._consumer = new_consumer(
            settings.bootstrap,
            broker_kind=settings.broker_kind,
            security=settings.security,
            group_id=settings.group,
            **portable_session(settings.broker_kind),
        )
        self._consumer.subscribe(
            [settings.topics.rows(self.registration.table)],
            listener=RevocationListener(self._forget),
        )
        self._producer = new_producer(settings.bootstrap, settings.security, linger_ms=5)
        await start_all(self._producer, self._consumer)
        rows_topic = settings.topics.rows(self.registration.table)
        log.info("query %s ready: windows of %s", self.registration.name, rows_topic)
        self.ready.set()
        try:
            while True:
                await self._step()
        finally:
            await self._consumer.stop()
            await self._producer.stop()

    async def _step(self) -> None:
        batches = await self._consumer.getmany(timeout_ms=POLL_MS, max_records=BATCH_RECORDS)
        sends = []
        closed: list[Window] = []
        rejected: list[str] = []
        for partition, records in batches.items():
            cutter = self._cutter(partition)
            for record in records:
                checked = check_row(self.registration, record.value)
                row = None
                if isinstance(checked, RowRejection):
                    sends.append(self._dead_letter(record, checked.reason))
                    rejected.append(checked.reason)
                else:
                    row = checked
                stamp = record.timestamp / 1000 if record.timestamp >= 0 else time.time()
                closed += cutter.add(record.offset, stamp, row)
            self.rows_seen += len(records)
        now = time.time()
        for cutter in self._cutters.values():
            expired = cutter.expire(now, self.settings.lateness)
            if expired is not None:
                closed.append(expired)
        for window in closed:
            sends.append(await self._publish(window))
        await asyncio.gather(*sends)  # every relQuery and dead letter is on the broker
        if rejected:
            log.warning(
                "query %s: %d rows dead-lettered (relstream deadletters lists them); first: %s",
                self.registration.name,
                len(rejected),
                rejected[0],
            )
        await self._commit()

    def _cutter(self, partition: TopicPartition) -> PartitionWindows:
        cutter = self._cutters.get(partition)
        if cutter is None:
            cutter = self._cutters[partition] = PartitionWindows(
                self.registration, partition.partition
            )
        return cutter

    async def _publish(self, window: Window) -> asyncio.Future:
        message = relquery_for_window(self.registration, window.rows, window.window_id)
        log.info("window %s: %d rows", message.id, len(message.rows))
        return await self._producer.send(
            self.settings.topics.relqueries, encode(message), key=message.id.encode()
        )

    def _dead_letter(self, record, reason: str) -> asyncio.Future:
        """The letter on its way (`send_dead_letter`): a bad row never stops the worker."""
        return send_dead_letter(self._producer, self.settings.topics.deadletter, record, reason)

    async def _commit(self) -> None:
        offsets = {
            partition: offset
            for partition, cutter in self._cutters.items()
            if (offset := cutter.committable()) is not None
            and self._committed.get(partition) != offset
        }
        self._committed.update(await commit_assigned(self._consumer, offsets))

    async def _forget(self, revoked: set) -> None:
        """Drop revoked partitions' open windows: their new owner replays them from the
        committed offset, each open window's start."""
        for partition in revoked:
            self._cutters.pop(partition, None)
            self._committed.pop(partition, None)
