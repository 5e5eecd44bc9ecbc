"""A relQuery's `deadline_s` end to end: refused with the field named when it is not a
positive number; through a real broker and the engine service on the simulated
backend, its result and metrics message say whether it was met, and Prometheus counts."""

import asyncio
import math
import time
import uuid

import httpx
import msgpack
import pytest
from aiokafka import AIOKafkaProducer

from relstream.engine.requests import seconds_left
from relstream.kafka.clients.aio import read_messages
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.model import RelQuery, Row, Template
from relstream.service.http import build_http_app
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend
from relstream.stream.registrations import RegistrationError, load_registrations
from relstream.stream.windowing import relquery_for_window
from relstream.wire import (
    MessageError,
    MetricsMessage,
    RelQueryMessage,
    ResultMessage,
    RowMessage,
    decode,
    encode,
)
from relstream.wire.convert import relquery_message


def relquery(name: str, deadline_s: float | None) -> RelQuery:
    rows = [Row(f"{name}-{k}", {"city": f"city-{k}"}) for k in range(3)]
    rq_id = f"{name}-{uuid.uuid4().hex[:6]}"
    return RelQuery(rq_id, Template("Describe {city}."), rows, 5, deadline_s=deadline_s)


@pytest.mark.parametrize("bad", [-1.0, 0.0, math.nan, math.inf])
def test_a_deadline_that_is_not_a_positive_number_is_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match="deadline_s"):
        relquery("bad", bad)
    wire = msgpack.unpackb(encode(relquery_message(relquery("ok", 1.0))))
    with pytest.raises(MessageError, match="field deadline_s"):
        decode(RelQueryMessage, msgpack.packb({**wire, "deadline_s": bad}))


def test_without_a_deadline_the_message_does_not_carry_the_field():
    assert b"deadline_s" not in encode(relquery_message(relquery("plain", None)))


def test_results_say_whether_the_deadline_was_met(broker):
    topics = Topics(prefix=f"d{uuid.uuid4().hex[:6]}.")
    # An hour is met; a microsecond is not (the simulated latency alone is longer);
    # without a deadline the result says nothing.
    sent = {
        "easy": relquery("easy", 3600.0),
        "tight": relquery("tight", 1e-6),
        "none": relquery("none", None),
    }

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"engine-{uuid.uuid4().hex}", broker=broker.kind
        )
        stop = asyncio.Event()
        service = KafkaService(config, SimRelQueryBackend())
        task = asyncio.create_task(service.run(stop))
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        for rq in sent.values():
            value = encode(relquery_message(rq))
            await producer.send_and_wait(topics.relqueries, value, key=rq.id.encode())
        await producer.stop()
        results = await read_messages(broker.bootstrap, topics.results, 3, broker.kind)
        metrics = await read_messages(broker.bootstrap, topics.metrics, 3, broker.kind)
        stop.set()
        await task
        counted = {
            met: service.metrics.deadlines.labels(met)._value.get() for met in ("true", "false")
        }
        return results, metrics, counted

    results, metrics, counted = asyncio.run(scenario())
    expected = {sent["easy"].id: True, sent["tight"].id: False, sent["none"].id: None}
    met = {r.id: r.deadline_met for r in (decode(ResultMessage, m.value) for m in results)}
    assert met == expected
    by_metrics = {
        m.relquery_id: m.deadline_met for m in (decode(MetricsMessage, v.value) for v in metrics)
    }
    assert by_metrics == expected
    assert counted == {"true": 1.0, "false": 1.0}


def test_the_http_door_answers_whether_the_deadline_was_met():
    def post(**fields):
        payload = {
            "version": 1,
            "id": f"h-{uuid.uuid4().hex[:6]}",
            "template": "Describe {city}.",
            "rows": [{"key": "r0", "values": {"city": "Oslo"}}],
            "max_output_tokens": 8,
            "submitted_at": time.time(),
            **fields,
        }

        async def run():
            app = build_http_app(SimRelQueryBackend())
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://door") as client:
                return await client.post("/v1/relqueries", json=payload)

        return asyncio.run(run())

    assert post(deadline_s=3600).json()["deadline_met"] is True
    assert post(deadline_s=1e-6).json()["deadline_met"] is False
    assert "deadline_met" not in post().json()
    refused = post(deadline_s=-2)
    assert refused.status_code == 400 and "field deadline_s" in refused.json()["error"]


def test_a_registration_gives_each_window_its_deadline(tmp_path):
    query = (
        '[[query]]\nname = "cities"\ntable = "cities"\ntemplate = "Describe {city}."\n'
        "deadline_s = DEADLINE\n"
    )
    path = tmp_path / "queries.toml"
    path.write_text(query.replace("DEADLINE", "30.0"))
    (registration,) = load_registrations(path)
    row = RowMessage(table="cities", key="k", values={"city": "Oslo"})
    assert relquery_for_window(registration, [row], "0-0@0").deadline_s == 30.0
    path.write_text(query.replace("DEADLINE", "-1"))
    with pytest.raises(RegistrationError, match="field deadline_s"):
        load_registrations(path)


def test_the_engine_is_told_the_seconds_left_after_kafka_and_its_own_queue():
    # Submitted 2 s ago (wall clock), taken by the engine 1 s ago (monotonic): of a 10 s
    # deadline, 7 s are left; a relQuery built without a submission time counts no queue.
    rq = relquery("left", 10.0)
    rq.arrival_time = time.time() - 2.0
    assert seconds_left(rq, time.monotonic() - 1.0) == pytest.approx(7.0, abs=0.05)
    assert seconds_left(relquery("fresh", 10.0), time.monotonic()) == pytest.approx(10.0, abs=0.05)
    assert seconds_left(relquery("none", None), time.monotonic()) is None
