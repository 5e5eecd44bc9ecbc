"""One registration's window stage: its rows topic → windows → the relqueries topic.

It reads whole batches of records (per-event handling was what held the worker to
~7,000 rows/s), cuts each input partition into windows (`windowing.PartitionWindows`),
publishes a window's relQuery, and only once the broker has it commits the partition up
to the start of the window still open. A crashed worker therefore replays from there
and cuts the same windows under the same ids. A relQuery or dead letter the broker does
not take (an outage) is held and re-published with backoff until it is acknowledged
(`kafka.delivery.publish`); meanwhile the stage's partitions are paused and nothing is committed,
so an outage holds at most one fetch (`BATCH_RECORDS` rows) and the windows it closed.
Windows are cut under the relqueries topic's message limit, asked of the broker at start
(`windowing`, `kafka.clients.limits`); a relQuery the broker still refuses for good (`Refused`)
becomes a dead letter for each of its rows, and the stage goes on.
Each registration reads with its own consumer group, so registrations over one table keep
their own offsets.

Where the broker has transactions (found at start) the above is exactly once instead:
each rows partition's windows, dead letters and offset commit go in one transaction, and
a replacement fences a killed worker and resumes from its commit. Without them (Tansu)
the stage says so once and runs at least once as described. Both through the one
delivery layer the engine uses too (`kafka.delivery.outputs`, `commits`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aiokafka import TopicPartition
from aiokafka.errors import IllegalStateError

from relstream.kafka.clients.aio import (
    RevocationListener,
    commit_assigned,
    new_consumer,
    new_producer,
    portable_session,
)
from relstream.kafka.clients.limits import message_limit
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.letters import Part
from relstream.kafka.delivery.outputs import open_outputs
from relstream.kafka.delivery.publish import Refused, Send
from relstream.kafka.membership.static import rejoin, start_waiting, stop_leaving
from relstream.placement.book import Demand, demand_of
from relstream.placement.readers import AsyncLoadReader
from relstream.stream.commits import WindowCommits, commit_all, row_letters
from relstream.stream.newest import say_missing_columns
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import (
    PartitionWindows,
    RowRejection,
    Window,
    needed_columns,
    relquery_for_window,
    window_priority,
)
from relstream.wire import RelQueryMessage, encode

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
    # The largest relQuery message, its windows cut under it (`windowing`); None: the
    # relqueries topic's limit, asked of the broker at start (`kafka.clients.limits`).
    message_bytes: int | None = None
    instance_id: str | None = None  # its static member id in the group (None: dynamic)
    transactions: bool = True  # exactly once where the broker has them (`kafka.delivery.outputs`)


class WindowStage:
    def __init__(
        self,
        registration: QueryRegistration,
        settings: StageSettings,
        placer: AsyncLoadReader | None = None,
    ) -> None:
        self.registration = registration
        self.settings = settings
        self.placer = placer  # where engines' load reports place relQueries (None: the hash)
        self._cutters: dict[TopicPartition, PartitionWindows] = {}
        self._committed: dict[TopicPartition, int] = {}
        # At least once only: per partition, windows published and not yet committed past
        # (`Window.start` -> last offset), kept across a rebalance so a replay cuts them the same
        # (`windowing`). With transactions nothing uncommitted is visible (`commits`).
        self._published: dict[int, dict[tuple[int, int], int]] = {}
        self._commits: WindowCommits  # exactly once or at least once (`_choose_delivery`)
        self._rebalances = RevocationListener(self._forget, self._assigned)
        self.ready = self._rebalances.joined  # set once it has joined its group

    async def run(self) -> None:
        """Window rows until cancelled."""
        settings = self.settings
        self._consumer = new_consumer(
            settings.bootstrap,
            broker_kind=settings.broker_kind,
            security=settings.security,
            group_id=settings.group,
            group_instance_id=settings.instance_id,  # a restart takes its partitions back
            **portable_session(settings.broker_kind),
        )
        self._consumer.subscribe(
            [settings.topics.rows(self.registration.table)],
            listener=self._rebalances,
        )
        self._producer = new_producer(settings.bootstrap, settings.security, linger_ms=5)
        self._message_bytes = settings.message_bytes or await message_limit(
            settings.bootstrap, settings.topics.relqueries, settings.security
        )
        await self._choose_delivery()
        await start_waiting(None, log, settings.bootstrap, self._producer, self._consumer)
        rows_topic = settings.topics.rows(self.registration.table)
        await say_missing_columns(
            self.registration.name, needed_columns(self.registration), settings.bootstrap,
            rows_topic, settings.security, settings.broker_kind,
        )  # fmt: skip
        log.info(
            "query %s: windows of %s, each relQuery under %d bytes",
            self.registration.name,
            rows_topic,
            self._message_bytes,
        )
        self.ready.set()
        try:
            while True:
                await self._step()
        finally:
            await stop_leaving(self._consumer)  # its partitions move at once
            await self._commits.outputs.stop()
            await self._producer.stop()

    async def _choose_delivery(self) -> None:
        """Exactly once where the broker has transactions, else at least once, said once
        in the log (`kafka.delivery.outputs`)."""
        settings = self.settings
        outputs = await open_outputs(
            f"query {self.registration.name}", "windows",
            bootstrap=settings.bootstrap, group=settings.group, security=settings.security,
            producer=self._producer, transactions=settings.transactions,
            on_fenced=lambda partition: rejoin(self._consumer, partition),  # zombie: ask again
            log=log,
        )  # fmt: skip
        self._commits = WindowCommits(outputs, settings.topics.deadletter)

    async def _step(self) -> None:
        batches = await self._consumer.getmany(timeout_ms=POLL_MS, max_records=BATCH_RECORDS)
        closed: list[Window] = []
        rejected: list[str] = []
        commits = self._commits
        # The step's work belongs to the assignments it is read under (`commits.lease`).
        leases = {p: commits.lease(p) for p in {*batches, *self._cutters}}
        for partition, records in batches.items():
            if commits.outputs.settling(partition):  # sought once fenced
                continue
            cutter = self._cutter(partition)
            for record in records:
                checked = cutter.check(record.value, record.headers)
                row = size = None
                if isinstance(checked, RowRejection):
                    commits.hold(partition, record, checked.reason)  # sent with the commit
                    rejected.append(checked.reason)  # that passes it
                else:
                    row, size = checked
                stamp = record.timestamp / 1000 if record.timestamp >= 0 else time.time()
                closed += cutter.add(record.offset, stamp, row, size)
        now = time.time()
        for partition, cutter in list(self._cutters.items()):
            if cutter.open is None or not await self._read_to_end(partition):
                continue
            expired = cutter.expire(now, self.settings.lateness)
            if expired is not None:
                closed.append(expired)
        self._log_rejected(rejected)
        await self._deliver(closed, leases)

    async def _read_to_end(self, partition: TopicPartition) -> bool:
        """Whether `partition` was read up to the end its last fetch saw: only then may
        the clock close its open window. Closed while rows of it were unread (a backlog
        over one step), a window would end at a fetch boundary, and a restart before the
        commit would cut it again with more rows under the same id (the protocol model,
        tests/kafka/test_protocol.py, found it)."""
        end = self._consumer.last_stable_offset(partition)
        if end is None or end < 0:  # not yet fetched, or a broker that does not say
            end = self._consumer.highwater(partition)
        if end is None:
            return False
        try:
            return await self._consumer.position(partition) >= end
        except IllegalStateError:  # revoked meanwhile
            return False

    def _log_rejected(self, rejected: list[str]) -> None:
        if rejected:
            log.warning(
                "query %s: %d rows dead-lettered (relstream deadletters lists them); first: %s",
                self.registration.name,
                len(rejected),
                rejected[0],
            )

    async def _deliver(self, closed: list[Window], leases: dict) -> None:
        """Per partition, its closed windows' relQueries, the held dead letters the commit
        passes, and the commit: one transaction, or (at least once) each sent until the
        broker has it and then the consumer's commit (`commits`)."""
        rows_topic = self.settings.topics.rows(self.registration.table)
        exactly_once = self._commits.outputs.exactly_once
        windows: dict[TopicPartition, list[Part]] = {}
        for window in closed:
            sent = self._published.get(window.partition, {}).get(window.start)
            if not exactly_once and sent == window.last_offset:  # a replay, cut the same
                name = window.window_id(self.registration.name)
                log.info("window %s: replayed as published, not sent again", name)
                continue
            part = await self._window_part(window)
            windows.setdefault(TopicPartition(rows_topic, window.partition), []).append(part)
        with self._holding(len(closed) + self._commits.held()) as stalled:
            fenced = await commit_all(self._commits, self._cutters, windows, stalled, leases)
        for partition in fenced:
            self._cutters.pop(partition, None)
        if not exactly_once:
            for window in closed:
                self._published.setdefault(window.partition, {})[window.start] = window.last_offset
            await self._commit()

    async def _window_part(self, window: Window) -> Part:
        """The window's relQuery; refused for good, its rows' letters."""
        send = await self._relquery(window)
        rows_topic = self.settings.topics.rows(self.registration.table)
        topic = self.settings.topics.deadletter

        def instead(refusal: Refused) -> list[Part]:
            log.error("%s; its %d rows are dead-lettered", refusal, len(window.rows))
            return row_letters(window, rows_topic, topic, str(refusal))

        return Part(send, instead)

    def _cutter(self, partition: TopicPartition) -> PartitionWindows:
        cutter = self._cutters.get(partition)
        if cutter is None:
            exactly_once = self._commits.outputs.exactly_once
            published = {} if exactly_once else self._published.setdefault(partition.partition, {})
            cutter = self._cutters[partition] = PartitionWindows(
                self.registration, partition.partition, published, self._message_bytes
            )
        return cutter

    async def _relquery(self, window: Window) -> Send:
        """The window's relQuery: built, encoded and, where it is placed by load, sized
        off the event loop (a window may hold 100,000 rows)."""
        placed = self.placer is not None
        message, value, demand = await asyncio.to_thread(
            _encoded, self.registration, window, placed
        )
        log.info("window %s: %d rows", message.id, len(message.rows))
        partition = None if demand is None else self.placer.place(demand)
        topic, key = self.settings.topics.relqueries, message.id.encode()
        return Send(topic, value, key, f"relQuery {message.id}", partition=partition)

    @contextlib.contextmanager
    def _holding(self, held: int) -> Iterator[Callable[[], None]]:
        """A `stalled` callback for the step's `held` deliveries: its first call pauses
        every assigned partition (logged), and leaving the block resumes them (logged)."""
        since = None

        def stalled() -> None:
            nonlocal since
            if since is None:
                since = time.monotonic()
                self._consumer.pause(*self._consumer.assignment())
                log.warning(
                    "query %s: pausing its rows partitions: the broker does not acknowledge "
                    "relQueries or dead letters; %d held, re-published with backoff",
                    self.registration.name,
                    held,
                )

        try:
            yield stalled
        finally:
            if since is not None:
                self._consumer.resume(*self._consumer.assignment())
                log.warning(
                    "query %s: resuming its rows partitions: the broker acknowledges again "
                    "(paused %.1f s)",
                    self.registration.name,
                    time.monotonic() - since,
                )

    async def _commit(self) -> None:
        offsets = {
            partition: offset
            for partition, cutter in self._cutters.items()
            if (offset := cutter.committable()) is not None
            and self._committed.get(partition) != offset
        }
        committed = await commit_assigned(self._consumer, offsets)
        self._committed.update(committed)
        for partition, offset in committed.items():  # what lies below is never replayed
            kept = self._published.get(partition.partition, {})
            for start in [start for start in kept if start[0] < offset]:
                del kept[start]

    async def _forget(self, revoked: set) -> None:
        """Drop revoked partitions' open windows: their new owner replays them from the
        committed offset, each open window's start."""
        for partition in revoked:
            self._cutters.pop(partition, None)
            self._committed.pop(partition, None)
            self._commits.forget(partition)
        await self._commits.outputs.revoked(revoked)

    async def _assigned(self, assigned: set) -> None:
        """With transactions: fence the partitions' previous owners, then seek each to its
        committed offset (`PartitionProducers.take_over`)."""
        await self._commits.outputs.assigned(self._consumer, assigned)


def _encoded(
    registration: QueryRegistration, window: Window, placed: bool
) -> tuple[RelQueryMessage, bytes, Demand | None]:
    priority = window_priority(registration, window.first_ms, time.time())
    message = relquery_for_window(
        registration, window.rows, window.window_id(registration.name), priority
    )
    return message, encode(message), demand_of(message) if placed else None
