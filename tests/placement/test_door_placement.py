"""The HTTP door places relQueries by load, on a real broker: two simulated engines in one
group serve Kafka behind their doors and report their load; one is four times slower, so
most relQueries POSTed to its door are answered by the other through Kafka, each once,
with its own rows, in the door's own JSON."""

import asyncio
import collections
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import msgspec
import pytest
from aiokafka.structs import ConsumerRecord
from engines import answers_by, engine_process, keys_written, scrape, wait_for
from helpers import door_serving, http_server, post_and_leave

from relstream.kafka.clients.aio import new_producer, read_messages, start_all
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.security import PLAINTEXT
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.publish import publish_acked
from relstream.kafka.tools.brokers import EmbeddedBroker, free_port
from relstream.placement.readers import LoadReader
from relstream.placement.reports import HEADERS
from relstream.service.doorlimits import DoorLimits
from relstream.service.forward import DoorPlacement, ResultFollower
from relstream.service.http import build_http_app
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.wire import (
    ControlMessage,
    DeadLetterMessage,
    LoadReportMessage,
    RelQueryMessage,
    ResultMessage,
    decode,
    encode,
)
from relstream.wire.messages import ResultRow
from relstream.wire.parts import split_result

PARTITIONS = 4  # two for each engine
COUNT = 30
EVERY_S = 0.2  # between two POSTs
IN_FLIGHT = "relstream_rows_in_flight"


def payload(index: int | str, outputs: int = 16) -> dict:
    """A relQuery of 8 rows (of 16 output tokens: 0.8 s on the simulator, 3.2 s slowed)."""
    rows = [{"key": f"r{index}-{k}", "values": {"city": f"city-{index}-{k}"}} for k in range(8)]
    return {
        "version": 1,
        "id": f"door-{index}",
        "template": "Describe {city}.",
        "rows": rows,
        "max_output_tokens": outputs,
        "submitted_at": 0,  # as a client without a clock sends it
    }


def listening(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def reporting_idle(reader: LoadReader, since: float) -> bool:
    """Whether both engines' latest reports that `reader` read say they have nothing to
    do, measured at `since` or later."""
    with reader._lock:  # the book is its reading thread's
        reports = list(reader.book._placement._reports.values())
    return len(reports) == 2 and all(
        report.load.outstanding_s <= 0 and report.at >= since for report in reports
    )


@pytest.mark.slow
def test_a_slow_engines_door_sends_most_relqueries_to_the_other_engine(tmp_path):
    topics = Topics(prefix=f"dp{uuid.uuid4().hex[:6]}.", partitions=PARTITIONS)
    group = f"engine-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "engines.log"
    ports = (free_port(), free_port())
    with EmbeddedBroker("tansu") as broker:
        asyncio.run(create_topics(broker.bootstrap, topics.layout()))
        engines = [
            engine_process(
                broker, topics, group, log, budget_rows=4000, verb="serve",
                extra=["--load-reports", "--sim-speed", speed, "--http-port", str(port)],
            )
            for speed, port in zip(("1", "0.25"), ports, strict=True)
        ]  # fmt: skip
        fast, slow = engines
        door = f"http://127.0.0.1:{ports[1]}/v1/relqueries"
        reader = LoadReader(broker.bootstrap, topics)
        try:
            settled = wait_for(lambda: len(reader.engines()) == 2 and listening(ports[1]), 120)
            assert settled, f"engines reporting: {reader.engines()}\n{log.read_text()[-3000:]}"
            with ThreadPoolExecutor(COUNT) as pool:
                began, posts = time.time(), []
                for index in range(COUNT):
                    posts.append(pool.submit(httpx.post, door, json=payload(index), timeout=120))
                    time.sleep(EVERY_S)
                responses = [post.result() for post in posts]
                # Once both report being idle, the slow door keeps a relQuery (no needless
                # hop), so the next goes to the other engine, where a DELETE to the door
                # stops it. An engine reports at every look while at work, and going idle
                # once (then only as a heartbeat): a latest report that is idle and
                # measured after the posts began was measured once its work was done.
                idle = wait_for(lambda: reporting_idle(reader, began), 60)
                assert idle, f"the engines never reported being idle\n{log.read_text()[-3000:]}"
                kept = pool.submit(httpx.post, door, json=payload("kept", 256), timeout=120)
                asyncio.run(door_serving(ports[1]))  # kept: counted there before the next
                sent = pool.submit(httpx.post, door, json=payload("sent", 256), timeout=120)
                running = wait_for(lambda: scrape(ports[0]).get(IN_FLIGHT, 0) > 0, 60)
                assert running, "door-sent never ran on the other engine"
                deletes = [httpx.delete(f"{door}/door-{i}", timeout=30) for i in ("sent", "kept")]
                cancelled = [sent.result().json(), kept.result().json()]
            written = asyncio.run(keys_written(broker, topics.relqueries))
        finally:
            reader.close()
            for engine in engines:
                engine.terminate()
                engine.wait(30)
        answers = answers_by(broker, topics)
    assert [r.status_code for r in responses] == [200] * COUNT, log.read_text()[-3000:]
    results = [response.json() for response in responses]
    # Each POST answered with its own relQuery: its id, each row's answer under its key.
    for index, result in enumerate(results):
        assert result["id"] == f"door-{index}"
        assert {row["key"]: row["output"] for row in result["rows"]} == {
            f"r{index}-{k}": f"Describe city-{index}-{k}." for k in range(8)
        }
    # Served here or there, one JSON shape, timed from the door (not from 1970).
    assert len({tuple(sorted(result)) for result in results}) == 1
    assert max(result["latency"].get("queued", 0.0) for result in results) < 60
    # What the slow door forwarded, the fast engine answered through Kafka (its metrics
    # say so; the door's own answers publish none): most of them.
    forwarded = [rq for (pid, rq) in answers if pid == fast.pid]
    batch = [rq for rq in forwarded if rq != "door-sent"]
    assert len(batch) >= COUNT * 2 / 3, f"the slow door forwarded {len(batch)} of {COUNT}"
    # DELETE stops a relQuery where it runs, here or on the other engine.
    assert {"door-sent", "door-kept"} & set(forwarded) == {"door-sent"}
    assert [response.status_code for response in deletes] == [202, 202]
    for result in cancelled:
        assert "cancelled" in {row["status"] for row in result["rows"]}, result
    assert not [rq for (pid, rq) in answers if pid == slow.pid]
    # Each forwarded relQuery written once, to one partition, and answered once.
    assert written == collections.Counter(forwarded)
    assert set(answers.values()) == {1}


@pytest.mark.slow
def test_a_forwarded_relquery_with_no_result_in_its_deadline_is_a_504_and_cancelled():
    topics = Topics(prefix=f"dt{uuid.uuid4().hex[:6]}.", partitions=2)
    # An engine that reports being idle but has hung: nothing it is sent is answered.
    report = LoadReportMessage(
        engine="hung", topic=topics.relqueries, partitions=[0, 1], outstanding_s=0.0, at=0.0
    )

    async def scenario(broker):
        await create_topics(broker.bootstrap, topics.layout())
        placement = DoorPlacement(broker.bootstrap, topics, "here", broker.kind)
        producer = new_producer(broker.bootstrap)
        await start_all(placement, producer)
        try:
            value = encode(msgspec.structs.replace(report, at=time.time()))
            await publish_acked(
                producer, topics.metrics, value, b"hung", "a report", headers=HEADERS
            )
            async with asyncio.timeout(30):
                while placement.reader.book.engines() != ["hung"]:
                    await asyncio.sleep(0.1)
            app = build_http_app(SimRelQueryBackend(SimSettings()), placement=placement)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://door") as client:
                started = time.monotonic()
                response = await client.post(
                    "/v1/relqueries", json=payload("late") | {"deadline_s": 1.0}
                )
                took = time.monotonic() - started
        finally:
            await producer.stop()
            await placement.stop()
        sent = await read_messages(broker.bootstrap, topics.relqueries, 1, broker.kind)
        cancels = await read_messages(broker.bootstrap, topics.control, 1, broker.kind)
        return response, took, sent, cancels

    with EmbeddedBroker("tansu") as broker:
        response, took, sent, cancels = asyncio.run(scenario(broker))
    assert response.status_code == 504 and 1.0 <= took < 10, (response.text, took)
    assert response.json()["error"].startswith(
        "no result for relQuery 'door-late' from engine hung"
    )
    # Sent once, to a partition of the engine chosen; then cancelled there.
    assert [(m.key, m.partition) for m in sent] == [(b"door-late", 0)]
    assert decode(RelQueryMessage, sent[0].value).rows[0].key == "rlate-0"
    assert decode(ControlMessage, cancels[0].value).cancel == "door-late"


def record(topic: str, key: str, value: bytes, offset: int = 0) -> ConsumerRecord:
    return ConsumerRecord(topic, 0, offset, 0, 0, key.encode(), value, None, 0, len(value), ())


def test_the_results_follower_answers_a_waiter_with_its_whole_result_or_its_dead_letter():
    topics = Topics(prefix="u.")
    rows = [ResultRow(key=f"k{i}", status="ok", output="x" * 40) for i in range(6)]
    whole = ResultMessage(id="q1", rows=rows, latency=None, policy="p", model="m", completed_at=1.0)
    parts = split_result(whole, 250)  # an envelope of 70 bytes, ~60 a row: 2 rows a part
    letter = DeadLetterMessage(
        original=b"", topic=topics.relqueries, reason="served 3 times", at=1.0
    )

    async def scenario():
        follower = ResultFollower("127.0.0.1:1", topics, None, PLAINTEXT)  # never started
        answer, failed = follower.expect("q1"), follower.expect("q2")
        # Another relQuery's result, then q1's parts last first, one read twice.
        await follower.take(record(topics.results, "q9", encode(whole)))
        for part in [parts[2], parts[0], parts[2], parts[1]]:
            await follower.take(record(topics.results, "q1", encode(part)))
        await follower.take(record(topics.deadletter, "q2", encode(letter)))
        follower.forget("q1")
        return answer.result(), failed.exception(), "q1" in follower, len(follower)

    joined, error, kept, waiting = asyncio.run(scenario())
    assert len(parts) == 3 and joined == whole
    assert (error.status, error.reason) == (
        502,
        "the engine it was sent to dead-lettered it: served 3 times",
    )
    assert (kept, waiting) == (False, 1)


async def report_hung(broker, topics: Topics, placement: DoorPlacement) -> None:
    """Report an engine, "hung", idle on partition 0 (it answers nothing sent to it), and
    wait until `placement` knows it: the door then forwards every relQuery there."""
    report = LoadReportMessage(
        engine="hung", topic=topics.relqueries, partitions=[0], outstanding_s=0.0, at=time.time()
    )
    producer = new_producer(broker.bootstrap)
    await producer.start()
    try:
        await publish_acked(
            producer, topics.metrics, encode(report), b"hung", "a report", headers=HEADERS
        )
    finally:
        await producer.stop()
    async with asyncio.timeout(30):
        while placement.reader.book.engines() != ["hung"]:
            await asyncio.sleep(0.1)


def door_topics() -> Topics:
    return Topics(prefix=f"dl{uuid.uuid4().hex[:6]}.", partitions=2)


def test_two_requests_under_one_id_at_once_are_one_answer_and_one_409(default_broker):
    # No engine reports: the door weighs each relQuery (in a thread) and keeps it.
    topics = door_topics()

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        placement = DoorPlacement(default_broker.bootstrap, topics, "here", default_broker.kind)
        await placement.start()
        try:
            app = build_http_app(SimRelQueryBackend(SimSettings()), placement=placement)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://door") as client:
                posts = [client.post("/v1/relqueries", json=payload("twice")) for _ in range(2)]
                return await asyncio.gather(*posts)
        finally:
            await placement.stop()

    responses = asyncio.run(scenario())
    assert sorted(response.status_code for response in responses) == [200, 409]
    refused = next(response for response in responses if response.status_code == 409)
    assert refused.json() == {"error": "relQuery 'door-twice' is already being served"}


def test_a_forwarded_relquerys_client_that_goes_away_cancels_it_on_the_control_topic(
    default_broker,
):
    topics = door_topics()

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        placement = DoorPlacement(default_broker.bootstrap, topics, "here", default_broker.kind)
        await placement.start()
        try:
            await report_hung(default_broker, topics, placement)
            app = build_http_app(SimRelQueryBackend(SimSettings()), placement=placement)
            async with http_server(app) as port:
                gone = payload("gone") | {"deadline_s": 60.0}  # a 504 only a minute later
                on_the_topic = read_messages(
                    default_broker.bootstrap, topics.relqueries, 1, default_broker.kind, 30.0
                )
                await post_and_leave(port, gone, on_the_topic)  # once it is forwarded
                left = time.monotonic()
                cancels = await read_messages(
                    default_broker.bootstrap, topics.control, 1, default_broker.kind, 10.0
                )
                took = time.monotonic() - left
                waiting = placement.forwarded("door-gone")
        finally:
            await placement.stop()
        sent = await read_messages(
            default_broker.bootstrap, topics.relqueries, 1, default_broker.kind, 10.0
        )
        return cancels, took, waiting, sent

    cancels, took, waiting, sent = asyncio.run(scenario())
    # It was sent to the hung engine, then cancelled there once its client left.
    assert [(m.key, m.partition) for m in sent] == [(b"door-gone", 0)]
    assert [decode(ControlMessage, m.value).cancel for m in cancels] == ["door-gone"]
    assert took < 5 and not waiting


def test_forwarded_relqueries_hold_their_places_in_the_doors_bound(default_broker):
    topics = door_topics()

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        placement = DoorPlacement(default_broker.bootstrap, topics, "here", default_broker.kind)
        await placement.start()
        try:
            await report_hung(default_broker, topics, placement)
            app = build_http_app(
                SimRelQueryBackend(SimSettings()),
                placement=placement,
                limits=DoorLimits(relqueries=1),
            )
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://door") as client:
                held = payload("held") | {"deadline_s": 3.0}
                first = asyncio.create_task(client.post("/v1/relqueries", json=held))
                async with asyncio.timeout(10):
                    while not placement.forwarded("door-held"):
                        await asyncio.sleep(0.05)
                second = await client.post("/v1/relqueries", json=payload("next"))
                return await first, second
        finally:
            await placement.stop()

    first, second = asyncio.run(scenario())
    # Not served here past the bound: a 429 while the forwarded one awaits its answer.
    assert second.status_code == 429 and second.headers["retry-after"] == "1"
    assert first.status_code == 504
