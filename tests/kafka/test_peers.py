"""No peer can stop or steer the pipeline (issue 39, "No peer can stop or steer"), on a
real broker: a load report naming a partition the producer does not know, dated in the
future or not signed; a cancel of an id that is then submitted again; an unexpected error
serving a relQuery; a NaN in a message; a forged result part before the door's follower;
a dead letter the broker refuses; a best-effort publish during an outage."""

import asyncio
import logging
import math
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import ConsumerRecord
from helpers import UnencodableBackend, committed_offsets, relquery, until

from relstream.kafka.clients.aio import new_producer, read_messages
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.security import PLAINTEXT
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.letters import LOST_LETTERS, send_dead_letter
from relstream.kafka.delivery.publish import publish_acked, publish_best_effort
from relstream.kafka.tools.brokers import DEFAULT_BROKER, EmbeddedBroker
from relstream.placement.book import Demand
from relstream.placement.readers import AsyncLoadReader
from relstream.placement.reports import HEADERS
from relstream.service.forward import ResultFollower
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.wire import (
    ControlMessage,
    DeadLetterMessage,
    LoadReportMessage,
    ResultMessage,
    decode,
    encode,
)
from relstream.wire.convert import relquery_message
from relstream.wire.messages import ResultRow

SECRET = b"0123456789abcdef-engines"


def fresh_topics(partitions: int = 4) -> Topics:
    return Topics(prefix=f"p{uuid.uuid4().hex[:6]}.", partitions=partitions)


async def send_at(broker, topic: str, messages, at: float | None = None, headers=None):
    """Produce (key, value) pairs to partition 0 of `topic`, dated `at` (None: now)."""
    producer = new_producer(broker.bootstrap)
    await producer.start()
    try:
        stamp = None if at is None else int(at * 1000)
        for key, value in messages:
            sent = producer.send(topic, value, key=key, partition=0, timestamp_ms=stamp,
                                 headers=headers)  # fmt: skip
            await (await sent)
    finally:
        await producer.stop()


def test_a_partition_the_producer_does_not_know_is_sent_by_the_keys_hash(default_broker):
    # Two partitions; a load report (forged, or read after partitions were added that this
    # producer's metadata does not have yet) names partition 7. aiokafka asserts
    # "Unrecognized partition"; publish_acked sends by the key's hash instead.
    topic = f"two{uuid.uuid4().hex[:6]}"

    async def scenario():
        await create_topics(default_broker.bootstrap, {topic: 2})
        producer = new_producer(default_broker.bootstrap)
        await producer.start()
        try:
            tries = await publish_acked(producer, topic, b"v", b"k", "a probe", partition=7)
        finally:
            await producer.stop()
        taken = await read_messages(default_broker.bootstrap, topic, 1, default_broker.kind)
        return tries, [(m.partition, m.value) for m in taken]

    tries, taken = asyncio.run(scenario())
    assert tries == 1 and len(taken) == 1 and taken[0][1] == b"v" and taken[0][0] in (0, 1)


def test_a_reader_takes_only_signed_current_reports_of_partitions_that_exist(default_broker):
    # The relqueries topic has 2 partitions; the engines share SECRET. Five engines
    # report: a is signed and sound; b names partition 7; c is dated a minute ahead (it
    # would outlive c's real reports); d is unsigned; e is signed with another secret.
    from relstream.placement.reports import signed

    topics = fresh_topics(partitions=2)
    now = time.time()
    reports = {
        "a": ([1], now, SECRET),
        "b": ([0, 7], now, SECRET),
        "c": ([0], now + 60, SECRET),
        "d": ([0], now, None),
        "e": ([0], now, b"another secret, 16+ bytes"),
    }
    messages = [
        (
            engine.encode(),
            encode(
                signed(
                    LoadReportMessage(
                        engine=engine, topic=topics.relqueries, partitions=partitions,
                        outstanding_s=0.5, at=at,
                    ),
                    secret,
                )
            ),
        )
        for engine, (partitions, at, secret) in reports.items()
    ]  # fmt: skip

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        await send_at(default_broker, topics.metrics, messages, headers=HEADERS)
        reader = AsyncLoadReader(
            default_broker.bootstrap, topics, default_broker.kind, secret=SECRET
        )
        await reader.start()
        try:
            async with asyncio.timeout(30):
                while sum(reader.book.ignored.values()) < 4 or not reader.book.engines():
                    await asyncio.sleep(0.1)
            placed = reader.place(Demand(b"q", 10, 10, "t"))
        finally:
            await reader.stop()
        return reader.book.engines(), dict(reader.book.ignored), placed

    engines, ignored, placed = asyncio.run(scenario())
    assert engines == ["a"] and placed == 1
    assert ignored == {
        "names a partition the topic does not have": 1,
        "dated in the future": 1,
        "unsigned": 1,
        "badly signed": 1,
    }


def test_the_python_clients_reader_checks_reports_too(default_broker):
    from relstream.placement.readers import LoadReader
    from relstream.placement.reports import signed

    topics = fresh_topics(partitions=2)

    def report(engine: str, partitions: list[int]) -> tuple[bytes, bytes]:
        message = LoadReportMessage(
            engine=engine,
            topic=topics.relqueries,
            partitions=partitions,
            outstanding_s=0.5,
            at=time.time(),
        )
        return engine.encode(), encode(signed(message, SECRET))  # fmt: skip

    async def publish():
        await create_topics(default_broker.bootstrap, topics.layout())
        reports = [report("a", [1]), report("b", [0, 7])]
        await send_at(default_broker, topics.metrics, reports, headers=HEADERS)

    asyncio.run(publish())
    reader = LoadReader(default_broker.bootstrap, topics, secret=SECRET)
    try:
        engines, ignored = reader.engines(), dict(reader.book.ignored)
    finally:
        reader.close()
    assert engines == ["a"] and ignored == {"names a partition the topic does not have": 1}


def test_an_engine_with_the_secret_signs_its_reports_and_only_its_peers_take_them(
    default_broker,
):
    topics = fresh_topics(partitions=2)

    async def scenario():
        bootstrap, kind = default_broker.bootstrap, default_broker.kind
        await create_topics(bootstrap, topics.layout())
        peer = AsyncLoadReader(bootstrap, topics, kind, secret=SECRET)
        stranger = AsyncLoadReader(bootstrap, topics, kind, secret=b"not the engines' secret")
        config = config_for(default_broker, topics, answer_secret=SECRET, load_report_s=0.2)
        backend = SimRelQueryBackend(SimSettings(time_scale=0.0))
        stop = asyncio.Event()
        task = asyncio.create_task(KafkaService(config, backend).run(stop))
        await peer.start()
        await stranger.start()
        try:
            async with asyncio.timeout(60):
                while not peer.book.engines() or not stranger.book.ignored:
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await task
            await peer.stop()
            await stranger.stop()
        return len(peer.book.engines()), stranger.book.engines(), set(stranger.book.ignored)

    assert asyncio.run(scenario()) == (1, [], {"badly signed"})


def config_for(broker, topics: Topics, **options) -> ServiceConfig:
    group = f"g{uuid.uuid4().hex[:6]}"
    return ServiceConfig(broker.bootstrap, topics, group, broker=broker.kind, **options)


async def serve_until(broker, topics, backend, count: int, topic: str | None = None):
    """Serve `topics` with `backend` until `count` messages are on `topic` (the results
    topic by default); returns them and the service."""
    service = KafkaService(config_for(broker, topics), backend)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        read = await read_messages(broker.bootstrap, topic or topics.results, count, broker.kind)
    finally:
        stop.set()
        await task
    return read, service


@pytest.mark.slow
def test_a_cancel_stops_only_what_was_submitted_before_it_and_expires(default_broker):
    # One relQuery at a time, slowly: "blocker" runs while "waiting" waits behind it; both
    # are cancelled: cancelled. "again" was cancelled with them, then submitted again
    # with the same id (a client's retry after the door's 504, a replayed dead letter): it
    # runs. "stale" waited in Kafka three hours, and its cancel came two hours ago, past
    # the hour a cancel is kept: it runs.
    topics = fresh_topics()
    blocker, waiting, again, stale = (relquery(i) for i in range(4))
    hour = 3600.0

    def message(rq, submitted_at=None):
        return (rq.id.encode(), encode(relquery_message(rq, submitted_at)))

    def cancel(rq):
        return (None, encode(ControlMessage(cancel=rq.id)))

    async def scenario():
        bootstrap = default_broker.bootstrap
        await create_topics(bootstrap, topics.layout())
        await send_at(default_broker, topics.control, [cancel(stale)], time.time() - 2 * hour)
        backend = SimRelQueryBackend(SimSettings(time_scale=20.0))
        config = config_for(default_broker, topics, max_backlog_rows=1)
        service = KafkaService(config, backend)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        try:
            await send_at(default_broker, topics.relqueries, [message(blocker)])
            async with asyncio.timeout(30):
                while blocker.id not in service._serving:
                    await asyncio.sleep(0.05)
            await send_at(default_broker, topics.relqueries, [message(waiting)])
            cancels = [cancel(waiting), cancel(again), cancel(blocker)]
            await send_at(default_broker, topics.control, cancels)
            asked = getattr(service._cancels, "_asked", service._cancels)  # ids, by when
            async with asyncio.timeout(30):  # the follower has read them all
                while again.id not in asked:
                    await asyncio.sleep(0.05)
            await send_at(default_broker, topics.relqueries, [message(again)])
            old = time.time() - 3 * hour
            await send_at(default_broker, topics.relqueries, [message(stale, old)], old)
            read = await read_messages(bootstrap, topics.results, 4, default_broker.kind, 90)
        finally:
            stop.set()
            await task
        return {r.id: r for r in (decode(ResultMessage, m.value) for m in read)}

    results = asyncio.run(scenario())
    statuses = {id: {row.status for row in r.rows} for id, r in results.items()}
    assert statuses == {
        blocker.id: {"cancelled"},
        waiting.id: {"cancelled"},
        again.id: {"ok"},
        stale.id: {"ok"},
    }


def test_an_unexpected_error_dead_letters_its_relquery_and_commits_go_on(default_broker):
    # The first relQuery's result holds a value no encoder takes (a backend's bug): its
    # offset used to stay unfinished, so its partition committed nothing more for the life
    # of the process. It is dead-lettered with the reason, the next ones answered, and
    # the group's offset moves past all three.
    from aiokafka import AIOKafkaConsumer, TopicPartition

    topics = fresh_topics()
    sent = [replace(relquery(0), id="unencodable-0"), relquery(1), relquery(2)]

    async def committed_past(group: str, offset: int) -> bool:
        committed = await asyncio.to_thread(
            committed_offsets, default_broker.bootstrap, group, topics.relqueries
        )
        return committed.get(0, -1) >= offset

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        messages = [(b"k", encode(relquery_message(rq))) for rq in sent]
        await send_at(default_broker, topics.relqueries, messages)
        service = KafkaService(config_for(default_broker, topics), UnencodableBackend())
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        try:
            letters = await read_messages(
                default_broker.bootstrap, topics.deadletter, 1, default_broker.kind
            )
            results = await read_messages(
                default_broker.bootstrap, topics.results, 2, default_broker.kind
            )
            await until(lambda: committed_past(service.config.group_id, len(sent)), 30, "committed")
        finally:
            stop.set()
            await task
        consumer = AIOKafkaConsumer(
            bootstrap_servers=default_broker.bootstrap, group_id=service.config.group_id
        )
        await consumer.start()
        try:
            offset = await consumer.committed(TopicPartition(topics.relqueries, 0))
        finally:
            await consumer.stop()
        return decode(DeadLetterMessage, letters[0].value), results, offset

    letter, results, offset = asyncio.run(scenario())
    assert letter.offset == 0 and "could not finish" in letter.reason
    assert sorted(m.key for m in results) == sorted(rq.id.encode() for rq in sent[1:])
    assert offset == 3


def test_a_nan_submitted_at_is_dead_lettered_naming_the_field(default_broker):
    # It used to be served: its result's `queued` was NaN, which no reader decodes.
    topics = fresh_topics()
    sound = relquery(1)

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        messages = [
            (b"k", encode(relquery_message(relquery(0), math.nan))),
            (b"k", encode(relquery_message(sound))),
        ]
        await send_at(default_broker, topics.relqueries, messages)
        backend = SimRelQueryBackend(SimSettings(time_scale=0.0))
        letters, _ = await serve_until(default_broker, topics, backend, 1, topics.deadletter)
        results = await read_messages(
            default_broker.bootstrap, topics.results, 1, default_broker.kind
        )
        return decode(DeadLetterMessage, letters[0].value), [decode(ResultMessage, m.value)
                                                              for m in results]  # fmt: skip

    letter, results = asyncio.run(scenario())
    assert letter.offset == 0
    assert "field submitted_at: expected a finite number" in letter.reason
    assert [r.id for r in results] == [sound.id]


def test_a_forged_result_part_does_not_stop_the_doors_results_follower(default_broker):
    # Parts that cannot join (part 5 of 2, then part 0 of 2) before the real result: the
    # follower used to die on them, and every forwarded request then waited out its 504.
    topics = fresh_topics()
    real = ResultMessage(
        id="q1", rows=[ResultRow(key="k", status="ok", output="yes")], latency=None,
        policy="p", model="m", completed_at=1.0,
    )  # fmt: skip

    def part(index: int) -> ResultMessage:
        return ResultMessage(
            id="q1", rows=[], latency=None, policy="p", model="m", completed_at=1.0,
            part=index, parts=2,
        )  # fmt: skip

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        follower = ResultFollower(default_broker.bootstrap, topics, default_broker.kind, PLAINTEXT)
        await follower.start()
        try:
            answer = follower.expect("q1")
            forged = [(b"q1", encode(part(5))), (b"q1", encode(part(0))), (b"q1", encode(real))]
            await send_at(default_broker, topics.results, forged)
            async with asyncio.timeout(20):
                return await answer
        finally:
            await follower.stop()

    assert asyncio.run(scenario()) == real


def record(topic: str, value: bytes, offset: int) -> ConsumerRecord:
    return ConsumerRecord(topic, 0, offset, 0, 0, b"row-key", value, None, 0, len(value), ())


def test_a_refused_dead_letter_is_sent_without_its_bytes_or_counted_and_logged(
    default_broker, caplog
):
    # A dead-letter topic that takes messages of 2,000 bytes at most: a 5,000-byte row's
    # letter is refused for good, so it goes without the row's bytes (naming where they
    # are). One taking 100 bytes refuses even that: counted by kind, logged at error once.
    roomy, tight = f"dl{uuid.uuid4().hex[:6]}", f"dl{uuid.uuid4().hex[:6]}"
    row = record("rows.reviews", b"x" * 5000, 41)

    async def scenario():
        bootstrap = default_broker.bootstrap
        await create_topics(bootstrap, {roomy: 1}, configs={"max.message.bytes": "2000"})
        await create_topics(bootstrap, {tight: 1}, configs={"max.message.bytes": "100"})
        producer = new_producer(bootstrap)
        await producer.start()
        try:
            sent = await send_dead_letter(producer, roomy, row, "no such template column")
            lost = [await send_dead_letter(producer, tight, row, "bad row") for _ in range(2)]
        finally:
            await producer.stop()
        letters = await read_messages(bootstrap, roomy, 1, default_broker.kind)
        return sent, lost, decode(DeadLetterMessage, letters[0].value)

    lost_letters = LOST_LETTERS  # by kind of refusal
    before = sum(lost_letters.values())
    with caplog.at_level(logging.ERROR, logger="relstream.deadletters"):
        sent, lost, letter = asyncio.run(scenario())
    assert sent and letter.original == b"" and letter.truncated
    assert (letter.topic, letter.offset, letter.original_size) == ("rows.reviews", 41, 5000)
    assert lost == [False, False] and sum(lost_letters.values()) == before + 2
    errors = [r for r in caplog.records if r.name == "relstream.deadletters"]
    assert len(errors) == 1 and "rows.reviews[0]@41" in errors[0].getMessage()


def test_a_best_effort_publish_waits_at_most_its_bound_during_an_outage(tmp_path: Path):
    # The broker stops; a metrics message to a topic the producer has no metadata for
    # would wait for it up to the client's request timeout (40 s). It is dropped within
    # its bound, and counted.
    from relstream.kafka.delivery.publish import DROPPED

    broker = EmbeddedBroker(DEFAULT_BROKER, data_dir=tmp_path / "broker")
    broker.start()

    async def scenario():
        producer = new_producer(broker.bootstrap)
        await producer.start()
        try:
            broker.stop()
            began = time.monotonic()
            handed = await publish_best_effort(producer, "metrics-of-nobody", b"v", b"k")
            return handed, time.monotonic() - began
        finally:
            async with asyncio.timeout(30):
                await producer.stop()

    before = DROPPED["metrics-of-nobody"]  # dropped, by topic
    try:
        handed, waited = asyncio.run(scenario())
    finally:
        broker.stop()
    assert waited < 3.0  # its bound, 1 s, and a little
    assert handed is False and DROPPED["metrics-of-nobody"] == before + 1


def test_a_task_that_dies_is_logged_and_started_again(caplog):
    from relstream.kafka.clients.supervise import supervised

    runs = []

    async def flaky() -> None:
        runs.append(time.monotonic())
        if len(runs) < 3:
            raise RuntimeError("lost its consumer")
        await asyncio.Event().wait()  # the third run lives on

    async def scenario():
        task = asyncio.create_task(supervised("the flaky follower", flaky, first_s=0.05))
        async with asyncio.timeout(5):
            while len(runs) < 3:
                await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return task.cancelled()

    with caplog.at_level(logging.ERROR, logger="relstream.kafka.clients.supervise"):
        assert asyncio.run(scenario())
    died = [r for r in caplog.records if "the flaky follower died" in r.getMessage()]
    assert len(died) == 2 and all(r.exc_info for r in died)
    assert runs[2] - runs[1] >= 2 * (runs[1] - runs[0]) * 0.9  # the wait doubled
