"""The engine service against a real Kafka-protocol broker, with the simulated backend."""

import asyncio
import uuid

import msgpack
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from relstream.broker import Topics, client_settings
from relstream.engine.service import EngineService, OffsetBook, ServiceConfig
from relstream.engine.simbackend import SimRelQueryBackend
from relstream.model import RelQuery, Row, Template
from relstream.schemas import decode, encode
from relstream.schemas.convert import relquery_message


def relquery(index: int) -> RelQuery:
    rows = [Row(f"r{index}-{k}", {"city": f"city-{index}-{k}"}) for k in range(3)]
    return RelQuery(f"rq-{index}-{uuid.uuid4().hex[:6]}", Template("Describe {city}."), rows, 5)


async def collect(bootstrap, topic, count, broker_kind, timeout=30.0):
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"reader-{uuid.uuid4().hex}",
        auto_offset_reset="earliest",
        **client_settings(broker_kind),
    )
    await consumer.start()
    out = []
    try:
        async with asyncio.timeout(timeout):
            while len(out) < count:
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    out += messages
    finally:
        await consumer.stop()
    return out


def test_offset_book_commits_only_a_finished_prefix():
    book = OffsetBook()
    for offset in (5, 6, 7):
        book.start("p0", offset)
    book.finish("p0", 7)
    assert book.committable() == {}
    book.finish("p0", 5)
    assert book.committable() == {"p0": 6}
    book.finish("p0", 6)
    assert book.committable() == {"p0": 8}


def test_results_map_to_rows_and_bad_messages_are_dead_lettered(broker):
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:6]}.")

    async def scenario():
        from relstream.broker import create_topics

        await create_topics(broker.bootstrap, topics.layout(), broker.kind)
        config = ServiceConfig(
            broker.bootstrap,
            topics,
            group_id=f"engine-{uuid.uuid4().hex}",
            broker=broker.kind,
            partial_results=True,
        )
        stop = asyncio.Event()
        service = asyncio.create_task(EngineService(config, SimRelQueryBackend()).run(stop))
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        sent = [relquery(i) for i in range(3)]
        bad = [
            b"\xc1not msgpack",
            msgpack.packb({"version": 1, "id": "x"}),
            msgpack.packb({**relquery_message(sent[0]), "template": "Hi {row.__class__}"}),
            b"\xa2\xff\xfe",
        ]
        for index, rq in enumerate(sent):
            await producer.send_and_wait(
                topics.relqueries, encode("relquery", relquery_message(rq)), key=rq.id.encode()
            )
            await producer.send_and_wait(topics.relqueries, bad[index], key=b"bad")
        await producer.send_and_wait(topics.relqueries, bad[3], key=b"bad")
        await producer.stop()
        results = await collect(broker.bootstrap, topics.results, 3, broker.kind)
        dead = await collect(broker.bootstrap, topics.deadletter, 4, broker.kind)
        partials = await collect(broker.bootstrap, topics.partial_results, 9, broker.kind)
        stop.set()
        await service
        return sent, bad, results, dead, partials

    sent, bad, results, dead, partials = asyncio.run(scenario())
    by_id = {rq.id: rq for rq in sent}
    for message in results:
        result = decode("result", message.value)
        assert message.key.decode() == result["id"]
        rq = by_id[result["id"]]
        assert [row["key"] for row in result["rows"]] == [row.key for row in rq.rows]
        for row, source in zip(result["rows"], rq.rows, strict=True):
            assert row["status"] == "ok" and row["output"] == f"Describe {source.values['city']}."
        assert result["latency"]["total"] > 0
    reasons = sorted(decode("dead_letter", m.value)["reason"] for m in dead)
    assert any("not valid msgpack" in r for r in reasons)
    assert any("'template' is a required" in r for r in reasons)
    assert any("{row.__class__}" in r for r in reasons)
    assert any("UTF-8" in r for r in reasons)
    assert sorted(decode("dead_letter", m.value)["original"] for m in dead) == sorted(bad)
    assert len(partials) == 9
