"""The synchronous client (kafka-python) against an embedded broker and a real engine
service: rows in, an ad-hoc relQuery answered within a timeout, results iterated."""

import asyncio
import uuid

import pytest
from engines import engine_process

from relstream.client import RelstreamClient
from relstream.kafka.clients.aio import read_messages
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.wire import RowMessage, decode


@pytest.mark.slow
def test_the_client_produces_rows_asks_and_iterates_results(tmp_path):
    topics = Topics(prefix=f"c{uuid.uuid4().hex[:6]}.")
    with EmbeddedBroker("tansu") as broker:
        asyncio.run(create_topics(broker.bootstrap, topics.layout(("reviews",))))
        engine = engine_process(broker, topics, f"e-{uuid.uuid4().hex[:6]}", tmp_path / "e.log")
        try:
            with RelstreamClient(broker.bootstrap, topics.prefix, broker_kind="tansu") as client:
                rows = [{"key": f"r{i}", "values": {"review": f"text {i}"}} for i in range(5)]
                assert client.produce_rows("reviews", rows) == 5
                first = client.ask("Rate: {review}", rows[:2], timeout=60)
                second = client.ask("Echo: {review}", rows[2:], timeout=60)
                seen = [result.id for result in client.results(idle_seconds=2.0)]
            produced = asyncio.run(
                read_messages(broker.bootstrap, topics.rows("reviews"), 5, broker.kind)
            )
        finally:
            engine.terminate()
            engine.wait(30)
    assert sorted(decode(RowMessage, m.value).key for m in produced) == [f"r{i}" for i in range(5)]
    assert [(row.key, row.output) for row in first.rows] == [
        ("r0", "Rate: text 0"),
        ("r1", "Rate: text 1"),
    ]
    assert [row.output for row in second.rows] == ["Echo: text 2", "Echo: text 3", "Echo: text 4"]
    assert sorted(seen) == sorted([first.id, second.id])


def test_what_no_broker_or_worker_would_take_is_refused_before_it_is_sent():
    import pytest

    with EmbeddedBroker("tansu") as broker, RelstreamClient(broker.bootstrap) as client:
        rows = [{"key": "ok", "values": {"review": "fine"}}]
        rows.append({"key": "huge", "values": {"review": "x" * 300_000}})
        with pytest.raises(ValueError, match=r"row 'huge' is 300,0\d\d bytes encoded.*1 rows"):
            client.produce_rows("reviews", rows)
        long_rows = [{"key": f"r{i}", "values": {"text": "y" * 3000}} for i in range(600)]
        with pytest.raises(ValueError, match=r"relQuery 'big' is 1,8\d\d,\d\d\d bytes"):
            client.submit("Echo {text}", long_rows, relquery_id="big")
