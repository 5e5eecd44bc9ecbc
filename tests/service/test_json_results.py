"""The engine's `--result-format json` on both embedded brokers: relQueries in either
encoding are answered with JSON results carrying `content-type: application/json`, except
one that asks for msgpack; `RelstreamClient` reads both kinds from one topic."""

import asyncio
import json
import uuid

import msgpack
import pytest
from aiokafka import AIOKafkaProducer

from relstream.client import RelstreamClient
from relstream.kafka.clients.aio import read_messages
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend

JSON_HEADER = ("content-type", b"application/json")


def relquery(relquery_id: str, **extra) -> dict:
    return {
        "version": 1, "id": relquery_id, "template": "Echo {word}", "max_output_tokens": 4,
        "rows": [{"key": f"{relquery_id}-r", "values": {"word": relquery_id}}],
        "submitted_at": 1.0, **extra,
    }  # fmt: skip


@pytest.mark.slow
def test_an_engine_set_to_json_answers_in_json_unless_asked_otherwise(broker):
    topics = Topics(prefix=f"jr{uuid.uuid4().hex[:6]}.")
    sent = {
        "as-json": json.dumps(relquery("as-json")).encode(),  # detected: no header
        "as-msgpack": msgpack.packb(relquery("as-msgpack")),
        "wants-msgpack": json.dumps(relquery("wants-msgpack", result_format="msgpack")).encode(),
    }

    async def serve() -> list:
        await create_topics(broker.bootstrap, topics.layout())
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        for key, value in sent.items():
            await producer.send_and_wait(topics.relqueries, value, key=key.encode())
        await producer.stop()
        config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"e-{uuid.uuid4().hex[:8]}",
            broker=broker.kind, result_format="json",
        )  # fmt: skip
        stop = asyncio.Event()
        service = asyncio.create_task(KafkaService(config, SimRelQueryBackend()).run(stop))
        try:
            return await read_messages(broker.bootstrap, topics.results, 3, broker.kind, 60)
        finally:
            stop.set()
            await service

    records = {record.key.decode(): record for record in asyncio.run(serve())}
    assert set(records) == set(sent)
    for key in ("as-json", "as-msgpack"):
        assert list(records[key].headers) == [JSON_HEADER]
        result = json.loads(records[key].value)
        assert result["rows"][0]["output"].startswith(f"Echo {key}")
    assert not records["wants-msgpack"].headers
    assert msgpack.unpackb(records["wants-msgpack"].value)["id"] == "wants-msgpack"
    with RelstreamClient(broker.bootstrap, topics.prefix) as client:
        assert {result.id for result in client.results()} == set(sent)
