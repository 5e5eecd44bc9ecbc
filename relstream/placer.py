"""Placing relQueries by the load engines report, not by their key's hash (docs/operations.md,
Scale-out).

Engines publish, every few tenths of a second on the metrics topic, the relqueries
partitions they own and their outstanding work (`service/loadreport.py`).
A `LoadBook` keeps each engine's latest report and answers `partition_for(relquery)`
through `scheduler.placement.Placement`: a partition of the engine with the least work,
counting the relQueries this placer sent it since its report. With no fresh report it
answers None, and the caller sends as today: the producer hashes the key.

Placing chooses only a partition: the relQuery's id, key and message are the same, and a
message is sent once to the one partition chosen (a retry keeps it), so no relQuery is
lost or doubled by it. An engine that stops reporting stops being chosen once its last
report expires; what was sent to its partitions meanwhile is served by whichever engine
the group gives them, as with the hash.

A book takes only reports it can trust: of its topic, naming partitions that exist (the
relqueries topic's partition count as its reader last read it), dated neither older than
the expiry nor more than MAX_SKEW_S ahead of its clock (one dated in the future would
outlive the engine's real reports), with finite numbers, and signed with the engines'
secret where one is set (the answers' secret: `--answer-secret-file` on the engine,
`RELSTREAM_ANSWER_SECRET` for every process). Anything else is ignored, counted by
reason and logged once a period: no report can stop or steer a placer.

Two followers feed a book: `LoadReader` (a kafka-python consumer in a thread, for the
synchronous client) and `AsyncLoadReader` (aiokafka, for asyncio programs such as the
worker).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import threading
import time
from collections import Counter
from typing import NamedTuple

import msgspec
from aiokafka.errors import KafkaError

from relstream.backend import template_id
from relstream.kafka.clients import assign_all, new_consumer
from relstream.kafka.outage import RateLimited
from relstream.kafka.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.supervise import supervised
from relstream.kafka.sync import sync_consumer
from relstream.kafka.topics import Topics
from relstream.scheduler.placement import CHARS_PER_TOKEN, EXPIRY_S, Choice, EngineLoad, Placement
from relstream.schemas import LoadReportMessage, MessageError, RelQueryMessage, encode
from relstream.schemas.formats import Headers, decode_record
from relstream.schemas.messages import KIND_HEADER

log = logging.getLogger("relstream.placer")
log.addFilter(RateLimited(30.0))  # a flood of bad reports: one line per kind and period

PLACEMENTS = ("load", "hash")
PLACEMENT_ENV = "RELSTREAM_PLACEMENT"  # "hash" turns placement by load off
LOOKBACK_RECORDS = 500  # a reader starts this far before the metrics topic's end
CATCH_UP_S = 3.0  # a reader reads up to the end, at most this long, before placing
POLL_MS = 200
MAX_SKEW_S = 2.0  # a report dated further ahead of the reader's clock is not taken
PARTITIONS_EVERY_S = 30.0  # how often a reader reads the relqueries topic's partitions again
SECRET_ENV = "RELSTREAM_ANSWER_SECRET"  # the engines' secret (service/answercache.py)
MAC_CONTEXT = b"relstream.load_report.v1\0"


def engines_secret() -> bytes | None:
    """The engines' secret from `RELSTREAM_ANSWER_SECRET`, or None where it is not set."""
    return os.environ.get(SECRET_ENV, "").encode() or None


def report_mac(secret: bytes, report: LoadReportMessage) -> bytes:
    """HMAC-SHA256 over the report's message without its MAC."""
    unsigned = encode(msgspec.structs.replace(report, mac=None))
    return hmac.new(secret, MAC_CONTEXT + unsigned, hashlib.sha256).digest()


def signed(report: LoadReportMessage, secret: bytes | None) -> LoadReportMessage:
    """The report signed with `secret`; unchanged without one."""
    if not secret:
        return report
    return msgspec.structs.replace(report, mac=report_mac(secret, report))


def placement_of(asked: str | None) -> str:
    """The placement asked for, else by `RELSTREAM_PLACEMENT`, else "load"."""
    chosen = asked or os.environ.get(PLACEMENT_ENV, "load")
    if chosen not in PLACEMENTS:
        where = f"{PLACEMENT_ENV}=" if asked is None else "placement "
        raise ValueError(f"{where}{chosen!r}: must be one of {', '.join(PLACEMENTS)}")
    return chosen


def is_load_report(headers: Headers) -> bool:
    """Whether a metrics topic record is a load report (by its `relstream-kind` header)."""
    kind = LoadReportMessage.kind.encode()
    return any(name == KIND_HEADER and value == kind for name, value in headers or ())


def prompt_tokens(message: RelQueryMessage) -> int:
    """Prompt tokens of every row together, estimated from the characters (placement needs
    a relQuery's size before any engine tokenizes it)."""
    per_row = len(message.template) + len(message.system_prompt or "")
    chars = sum(per_row + sum(len(str(v)) for v in row.values.values()) for row in message.rows)
    return chars // CHARS_PER_TOKEN


class Demand(NamedTuple):
    """What placing a relQuery weighs: its key, its size in prompt and output tokens, and
    its template."""

    key: bytes
    prompt_tokens: int
    output_tokens: int
    template: str


def demand_of(message: RelQueryMessage) -> Demand:
    """A relQuery's demand: a walk over every row, so an event loop computes it in a
    thread (a window may hold 100,000 rows)."""
    output_tokens = message.max_output_tokens * len(message.rows)
    return Demand(
        message.id.encode(), prompt_tokens(message), output_tokens, template_id(message.template)
    )


class LoadBook:
    """The latest report of each engine serving `topic`, and the partition for a
    relQuery chosen from them. Not thread-safe: a reader guards it."""

    def __init__(self, topic: str, expiry: float = EXPIRY_S, clock=time.time,
                 secret: bytes | None = None, partitions: int | None = None) -> None:  # fmt: skip
        self.topic = topic
        self.clock = clock
        self.expiry = expiry
        self.secret = secret  # where set, only reports signed with it are taken
        self.partitions = partitions  # the topic's partition count, where known
        self.ignored: Counter[str] = Counter()  # reports not taken, by reason
        # Its hash fallback is never reached: with no fresh report the caller's producer
        # hashes the key, as it always has.
        self._placement = Placement(partitions=1, expiry=expiry)

    def take(self, value: bytes | None, headers: Headers) -> bool:
        """Keep a metrics topic record if it is a load report for this topic."""
        if not is_load_report(headers):
            return False
        try:
            report = decode_record(LoadReportMessage, value, headers)
        except MessageError as exc:
            log.warning("ignored a load report: %s", exc.reason)
            return False
        if report.topic != self.topic:
            return False
        why = self._untrusted(report)
        if why is not None:
            self.ignored[why] += 1
            if why != "expired":  # a reader starting behind the topic's end reads those
                log.warning(f"ignored load reports: {why} (engine %s)", report.engine)
            return False
        self._placement.report(
            EngineLoad(
                report.engine,
                tuple(report.partitions),
                report.outstanding_s,
                report.at,
                tuple(report.templates),
                report.per_prompt_token_s,
                report.per_output_token_s,
                tuple(report.size_counts),
            )
        )
        return True

    def _untrusted(self, report: LoadReportMessage) -> str | None:
        """Why `report` is not to be taken, or None."""
        if self.secret is not None:
            if report.mac is None:
                return "unsigned"
            if not hmac.compare_digest(report.mac, report_mac(self.secret, report)):
                return "badly signed"
        if not report.finite:
            return "work or prices not finite"
        now = self.clock()
        if not now - self.expiry <= report.at <= now + MAX_SKEW_S:
            return "expired" if report.at < now else "dated in the future"
        if self.partitions is not None and any(p >= self.partitions for p in report.partitions):
            return "names a partition the topic does not have"
        return None

    def engines(self) -> list[str]:
        """Engines with a fresh report that own partitions."""
        return sorted(load.engine for load in self._placement.fresh(self.clock()))

    def partition_for(self, message: RelQueryMessage) -> int | None:
        """The partition for this relQuery, counted as sent there; None with no fresh
        report (send it by its key's hash)."""
        return self.place(demand_of(message))

    def place(self, demand: Demand) -> int | None:
        """`partition_for`, its demand already computed."""
        choice = self.pick(demand)
        return None if choice is None else choice.partition

    def pick(self, demand: Demand, prefer: str | None = None) -> Choice | None:
        """The engine and partition for a relQuery, counted as sent there (`prefer` wins
        among engines within the margin of the least); None with no fresh report."""
        return self._placement.pick(
            demand.prompt_tokens, demand.output_tokens, self.clock(), demand.template, prefer
        )


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
        from relstream.kafka.bounds import partitions

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
