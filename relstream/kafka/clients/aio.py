"""Kafka clients as every relstream process makes them: one place for broker-specific
settings, topic creation, and the consume and produce loops.

Everything here speaks the Kafka protocol through aiokafka and works against any broker
given by its bootstrap address; `broker_kind` only adds what an embedded broker needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, ConsumerRecord
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
)

from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity

log = logging.getLogger("relstream.kafka")


# What one fetch may hold: aiokafka's per-partition default, and 4 MiB across partitions
# instead of its 50 MiB. A single batch larger than these still comes, one at a time
# (KIP-74), so a message of any size the broker took is read, then refused.
FETCH_PARTITION_BYTES = 2**20
FETCH_BYTES = 4 * 2**20


def new_consumer(
    bootstrap: str,
    *topics: str,
    broker_kind: str | None = None,
    security: KafkaSecurity = PLAINTEXT,
    **options: Any,
) -> AIOKafkaConsumer:
    """Every consumer relstream makes: the broker's settings and the security ones. It
    commits only when told (after the work is done), a new group starts from the
    earliest offset, a fetch holds at most `FETCH_BYTES`, and it reads only committed
    messages (what an aborted transaction wrote is never seen)."""
    options = {
        "enable_auto_commit": False,
        "isolation_level": "read_committed",
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": FETCH_PARTITION_BYTES,
        "fetch_max_bytes": FETCH_BYTES,
        **options,
    }
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        **client_settings(broker_kind),
        **security.client_options(),
        **options,
    )


# The largest request a relstream producer sends (aiokafka's default, and within the
# 1 MiB that Kafka brokers accept per message by default). Whatever relstream writes about
# a producer's message (a dead letter) must fit under it, whatever that message's size.
MAX_REQUEST_BYTES = 1_048_576
DEAD_LETTER_ORIGINAL_BYTES = MAX_REQUEST_BYTES // 2  # the rest is the letter's envelope
RESULT_PART_BYTES = MAX_REQUEST_BYTES - 16 * 1024  # a result's part, its key and the batch


def new_producer(
    bootstrap: str, security: KafkaSecurity = PLAINTEXT, **options: Any
) -> AIOKafkaProducer:
    """Every producer relstream makes: all replicas acknowledge each message."""
    options = {"max_request_size": MAX_REQUEST_BYTES, **options}
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", **security.client_options(), **options
    )


def new_admin(bootstrap: str, security: KafkaSecurity = PLAINTEXT, **options: Any):
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(bootstrap_servers=bootstrap, **security.client_options(), **options)


def new_client(bootstrap: str, security: KafkaSecurity = PLAINTEXT, **options: Any):
    """A bare client, for requests aiokafka's consumer and producer do not make."""
    from aiokafka import AIOKafkaClient

    return AIOKafkaClient(bootstrap_servers=bootstrap, **security.client_options(), **options)


START_RETRY_S = 1.0  # between a service's starts no broker answered
# How long an engine or a worker waits for its broker at its start (an engine before it
# loads its model): an Apache Kafka broker restarting takes 5-20 s on a loaded 2-core
# machine (the JVM, then its logs), so a worker restarted beside it waits it out.
BROKER_CHECK_S = 30.0


class BrokerSilent(ConnectionError):
    """No broker answered at the bootstrap address in time."""


async def check_broker(
    bootstrap: str, security: KafkaSecurity = PLAINTEXT, timeout_s: float = BROKER_CHECK_S
) -> None:
    """Raise BrokerSilent unless a broker at `bootstrap` answers within `timeout_s`: an
    engine asks before it loads its model (minutes for a large one), not after. A refused
    connection is tried again until then (a broker restarting takes a few seconds)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        left = deadline - asyncio.get_running_loop().time()
        admin = new_admin(bootstrap, security, request_timeout_ms=int(max(left, 0.1) * 1000))
        try:
            async with asyncio.timeout(max(left, 0.1)):
                await admin.start()
            return
        except (TimeoutError, KafkaError, OSError) as exc:
            if asyncio.get_running_loop().time() + 0.5 >= deadline:
                raise BrokerSilent(
                    f"no Kafka broker answered at {bootstrap} within {timeout_s:g} s "
                    f"({type(exc).__name__})"
                ) from None
        finally:
            with contextlib.suppress(Exception):
                await admin.close()
        await asyncio.sleep(0.5)


async def start_all(
    *clients: AIOKafkaConsumer | AIOKafkaProducer,
    waiting: Callable[[Exception], None] | None = None,
) -> None:
    """Start the clients in order; if one fails (no broker answered), stop them all before
    raising, so that none is left for the garbage collector to report as unclosed beside
    the one-line error. With `waiting` (a service, which waits out an outage at its
    start, where a one-shot command fails at once), a start no broker answered is tried
    again every START_RETRY_S, `waiting` told each time."""
    try:
        for client in clients:
            while True:
                try:
                    await client.start()
                    break
                except KafkaConnectionError as exc:  # bootstrap: nothing started yet
                    if waiting is None:
                        raise
                    waiting(exc)
                    await asyncio.sleep(START_RETRY_S)
    except BaseException:
        for client in clients:
            await client.stop()
        raise


@contextlib.asynccontextmanager
async def running(*clients: AIOKafkaConsumer | AIOKafkaProducer) -> AsyncIterator[None]:
    """The clients started (`start_all`), and stopped on leaving."""
    await start_all(*clients)
    try:
        yield
    finally:
        for client in clients:
            await client.stop()


async def assign_all(consumer: AIOKafkaConsumer, *topics: str) -> list:
    """Assign a started consumer (no group) every partition of `topics`; returns them."""
    from aiokafka import TopicPartition

    # Every topic's metadata, asked now: the consumer's own holds only the topics it is
    # already assigned (Kafka answers only those asked; aiokafka has no public call).
    cluster = await consumer._client.fetch_all_metadata()
    parts = [
        TopicPartition(topic, number)
        for topic in topics
        for number in sorted(cluster.partitions_for_topic(topic) or ())
    ]
    consumer.assign(parts)
    return parts


def client_settings(broker_kind: str | None) -> dict[str, object]:
    """Consumer options a broker needs. Tansu takes half the session timeout to let a
    member join, so its sessions are short (docs/architecture/delivery.md, "Brokers")."""
    if broker_kind == "tansu":
        return {"session_timeout_ms": 2000, "heartbeat_interval_ms": 500}
    return {}


# Consumer sessions that suit any broker: Apache Kafka accepts none under 6 s, and Tansu
# lets a member join after half the session (3 s here; 30 s at Faust's default).
PORTABLE_SESSION = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1500}


def portable_session(broker_kind: str | None) -> dict[str, object]:
    """Session options for a consumer that must join quickly on a broker of unknown kind
    (none when the kind is given: `client_settings` has them). Not for the engine, whose
    event loop a CPU model step may hold for seconds."""
    return {} if broker_kind else dict(PORTABLE_SESSION)


class Subscription:
    """Messages of one topic, read by a consumer group from its committed offsets (from
    the earliest for a new group), as an async context manager and iterator:

        async with Subscription(bootstrap, topic) as messages:
            async for message in messages: ...

    `idle_seconds`: end after that long without a message (None: never). `timeout`: raise
    TimeoutError after that long in all. `commit`: commit each batch once the caller has
    handled it (asked for the next message). `on_poll` runs before every poll, e.g. to
    check that the processes the caller waits on are alive.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        broker_kind: str | None = None,
        group: str | None = None,
        idle_seconds: float | None = None,
        timeout: float | None = None,
        commit: bool = False,
        on_poll: Callable[[], None] | None = None,
        poll_ms: int = 500,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        self._consumer = new_consumer(
            bootstrap,
            topic,
            broker_kind=broker_kind,
            security=security,
            group_id=group or f"relstream-reader-{uuid.uuid4().hex[:8]}",
        )
        self._idle_seconds = idle_seconds
        self._timeout = timeout
        self._commit = commit
        self._on_poll = on_poll
        self._poll_ms = poll_ms

    async def __aenter__(self) -> Subscription:
        await start_all(self._consumer)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._consumer.stop()

    async def __aiter__(self) -> AsyncIterator[ConsumerRecord]:
        started = last_message = time.monotonic()
        while True:
            now = time.monotonic()
            if self._timeout is not None and now - started > self._timeout:
                raise TimeoutError(f"no end of messages after {self._timeout:g} s")
            if self._idle_seconds is not None and now - last_message >= self._idle_seconds:
                return
            if self._on_poll:
                self._on_poll()
            batches = await self._consumer.getmany(timeout_ms=self._poll_ms)
            if not batches:
                continue
            last_message = time.monotonic()
            for messages in batches.values():
                for message in messages:
                    yield message
            if self._commit:
                await self._consumer.commit()

    async def take(self, count: int) -> list[ConsumerRecord]:
        """The next `count` messages (fewer only if the subscription ends first)."""
        taken: list[ConsumerRecord] = []
        if count <= 0:
            return taken
        async for message in self:
            taken.append(message)
            if len(taken) == count:
                break
        return taken


async def read_messages(
    bootstrap: str,
    topic: str,
    count: int,
    broker_kind: str | None,
    timeout: float = 30.0,
    security: KafkaSecurity = PLAINTEXT,
) -> list[ConsumerRecord]:
    """The first `count` messages of `topic`, read by a new group."""
    subscription = Subscription(
        bootstrap, topic, broker_kind=broker_kind, timeout=timeout, security=security
    )
    async with subscription as sub:
        return await sub.take(count)


async def produce(
    bootstrap: str,
    topic: str,
    messages: Iterable[tuple[bytes | None, bytes]],
    on_sent: Callable[[], None] | None = None,
    security: KafkaSecurity = PLAINTEXT,
    headers: list[tuple[str, bytes]] | None = None,
    **producer_options: Any,
) -> int:
    """Send (key, value) pairs to `topic`, each with `headers`, and wait until the broker
    has them all."""
    sent = 0
    producer = new_producer(bootstrap, security, **producer_options)
    async with running(producer):
        for key, value in messages:
            await producer.send(topic, value, key=key, headers=headers)
            sent += 1
            if on_sent:
                on_sent()
        await producer.flush()
    return sent


async def metadata_ok(bootstrap: str) -> None:
    """Raises unless a broker answers a metadata request at `bootstrap`."""
    admin = new_admin(bootstrap, request_timeout_ms=2000)
    await admin.start()
    await admin.close()


async def commit_assigned(consumer, offsets: dict) -> dict:
    """Commit `offsets` of the partitions still assigned; returns those committed. A commit
    the group refuses (it rebalanced meanwhile) is logged and dropped: whoever owns the
    partition now replays the work, and relstream's outputs are keyed for de-duplication."""
    assigned = consumer.assignment()
    offsets = {tp: offset for tp, offset in offsets.items() if tp in assigned}
    if not offsets:
        return {}
    try:
        await consumer.commit(offsets)
    except (CommitFailedError, IllegalStateError, KafkaError) as exc:
        log.warning("commit of %s refused (%s); the work will be replayed", offsets, exc)
        return {}
    return offsets


class RevocationListener(ConsumerRebalanceListener):
    """Calls `on_revoked(partitions)` before partitions are taken away and
    `on_assigned(partitions)` (if given) once they are handed over, before they are read,
    and sets `joined` once the consumer has joined its group (given its partitions, maybe
    none): from then on it takes its share of the work, so its process may say it is
    ready."""

    def __init__(
        self,
        on_revoked: Callable[[set], Awaitable[None]],
        on_assigned: Callable[[set], Awaitable[None]] | None = None,
    ) -> None:
        self._on_revoked = on_revoked
        self._on_assigned = on_assigned
        self.joined = asyncio.Event()

    async def on_partitions_revoked(self, revoked) -> None:
        await self._on_revoked(set(revoked))

    async def on_partitions_assigned(self, assigned) -> None:
        """New partitions start from their committed offsets (`on_assigned` may seek)."""
        if self._on_assigned is not None:
            await self._on_assigned(set(assigned))
        self.joined.set()
