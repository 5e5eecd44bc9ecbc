"""What the engine service promises about delivery, on a real broker with the simulated
backend: it takes the whole backlog within its row budget, counts latency from
submission, retries then dead-letters a relQuery it cannot serve, and on an engine
failure publishes and commits nothing past the work it was serving."""

import asyncio
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from helpers import FaultyBackend, entry_point_folder, relquery

from relstream.backend import EngineFailure
from relstream.kafka.clients.aio import produce, read_messages
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.model import Row
from relstream.service.backlog import RowBudget
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.wire import DeadLetterMessage, ResultMessage, decode, encode
from relstream.wire.convert import relquery_message


def config_for(broker, topics: Topics, group: str, **options) -> ServiceConfig:
    return ServiceConfig(broker.bootstrap, topics, group, broker=broker.kind, **options)


async def send(broker, topics: Topics, relqueries, submitted_at: float | None = None) -> None:
    """Produce `relqueries` in order to partition 0 of the relqueries topic."""
    await create_topics(broker.bootstrap, topics.layout())
    messages = [(b"k", encode(relquery_message(rq, submitted_at))) for rq in relqueries]
    await produce(
        broker.bootstrap,
        topics.relqueries,
        messages,
        partitioner=lambda *a: 0,
        max_request_size=8 << 20,  # the poison of over 1 MiB below
    )


async def committed(broker, topics: Topics, group: str) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topics.relqueries, 0))
    finally:
        await consumer.stop()


async def serve_and_watch(
    broker, topics, config: ServiceConfig, expected: int, watch, time_scale: float = 1.0
):
    """Serve with the simulated backend (`time_scale` of its latency in real time) until
    `expected` results are out; returns the largest `watch(service)` seen meanwhile, and
    the results."""
    service = KafkaService(config, SimRelQueryBackend(SimSettings(time_scale=time_scale)))
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    reader = asyncio.create_task(
        read_messages(broker.bootstrap, topics.results, expected, broker.kind, 60)
    )
    most = 0
    while not reader.done():
        most = max(most, watch(service))
        await asyncio.sleep(0.02)
    stop.set()
    await task
    return most, reader.result()


def fresh_topics() -> Topics:
    return Topics(prefix=f"d{uuid.uuid4().hex[:6]}.")


def test_the_budget_admits_in_order_and_a_big_relquery_beside_the_others():
    # Budget 12: no relQuery is charged more than 12 // 4 = 3 rows. a 2, b 3 (of 5),
    # huge 3 (of 50), c 2: 10 rows; d (3) would make 13 and waits.
    budget = RowBudget(rows=12)
    for name, rows in (("a", 2), ("b", 5), ("huge", 50), ("c", 2), ("d", 3)):
        budget.offer(rows, name)
    assert budget.admit() == ["a", "b", "huge", "c"]
    assert budget.full and budget.in_flight == 10
    budget.release(50)  # huge answered: its 3 rows come back
    assert budget.admit() == ["d"] and not budget.full and budget.in_flight == 10


def test_the_engine_takes_the_whole_backlog_and_counts_latency_from_submission(broker):
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    sent = [relquery(i) for i in range(30)]
    submitted = time.time() - 5.0  # five seconds in Kafka before the engine started

    async def scenario():
        await send(broker, topics, sent, submitted)
        config = config_for(broker, topics, group)
        # Three times the simulated latency: on a loaded machine (two test workers) the
        # first answers came before the last relQueries were read (27 of 30 at once).
        return await serve_and_watch(
            broker, topics, config, len(sent), lambda service: service.budget.relqueries, 3.0
        )

    most, results = asyncio.run(scenario())
    # All 30 relQueries (90 rows, far under the budget) were in the engine at once, not 8.
    assert most == len(sent)
    for message in results:
        latency = decode(ResultMessage, message.value).latency
        assert latency.queued >= 5.0
        assert latency.total == pytest.approx(
            latency.queued + latency.waiting + latency.core + latency.tail
        )


def test_a_small_budget_bounds_the_rows_in_flight_and_loses_nothing(broker):
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    sent = [relquery(i) for i in range(12)]  # 3 rows each

    async def scenario():
        await send(broker, topics, sent)
        config = config_for(broker, topics, group, max_backlog_rows=14)
        return await serve_and_watch(
            broker, topics, config, len(sent), lambda service: service.budget.in_flight
        )

    most, results = asyncio.run(scenario())
    assert most == 12  # four relQueries of 3 rows; a fifth would make 15 > 14
    assert {decode(ResultMessage, m.value).id for m in results} == {rq.id for rq in sent}


@pytest.mark.parametrize("padding", [0, 1_500_000], ids=["small", "over-1-MiB"])
def test_a_relquery_that_cannot_be_served_is_retried_then_dead_lettered(broker, padding):
    # Over 1 MiB, its dead letter must be cut to fit (it could not be sent whole, and
    # the partition stayed stuck behind it for good).
    if padding and broker.kind == "kafka":
        pytest.skip("Kafka refuses messages over 1 MiB (message.max.bytes)")
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    poison = relquery(1)
    poison.id = f"poison-{poison.id}"
    if padding:
        poison.rows.append(Row("padding", {"text": "p" * padding}))
    sent = [relquery(0), poison, relquery(2)]

    async def scenario():
        await send(broker, topics, sent)
        config = config_for(broker, topics, group, retry_backoff_s=0.1)
        stop = asyncio.Event()
        task = asyncio.create_task(KafkaService(config, FaultyBackend()).run(stop))
        results = await read_messages(broker.bootstrap, topics.results, 2, broker.kind)
        dead = await read_messages(broker.bootstrap, topics.deadletter, 1, broker.kind)
        deadline = time.monotonic() + 20  # the commit follows the dead letter
        while await committed(broker, topics, group) != 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        stop.set()
        await task
        return results, dead, await committed(broker, topics, group)

    results, dead, offset = asyncio.run(scenario())
    assert sorted(decode(ResultMessage, m.value).id for m in results) == sorted(
        [sent[0].id, sent[2].id]
    )
    letter = decode(DeadLetterMessage, dead[0].value)
    assert letter.offset == 1 and "serving failed 3 times" in letter.reason
    assert f"cannot serve {poison.id}" in letter.reason
    assert offset == 3  # the partition moved past the poison message
    assert letter.truncated == bool(padding) and letter.original_size > padding


def test_an_engine_failure_publishes_and_commits_nothing_past_its_work(broker):
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    dying = relquery(1)
    dying.id = f"dies-{dying.id}"
    sent = [relquery(0), dying, relquery(2)]

    async def scenario():
        await send(broker, topics, sent)
        # A budget of one row: the first relQuery is served (and published) alone before
        # the failing one is taken, and the third waits behind it.
        stop = asyncio.Event()
        config = config_for(broker, topics, group, max_backlog_rows=1)
        with pytest.raises(EngineFailure):
            await KafkaService(config, FaultyBackend()).run(stop)
        offset = await committed(broker, topics, group)
        before_restart = await read_messages(broker.bootstrap, topics.results, 1, broker.kind)
        # A restarted (healthy) engine in the same group answers what was left.
        healthy = asyncio.create_task(
            KafkaService(config_for(broker, topics, group), SimRelQueryBackend()).run(stop)
        )
        after = await read_messages(broker.bootstrap, topics.results, 3, broker.kind)
        stop.set()
        await healthy
        return offset, before_restart, after

    offset, before_restart, after = asyncio.run(scenario())
    assert offset == 1  # just past the first relQuery, never past the one that failed
    answered = [decode(ResultMessage, m.value) for m in after]
    assert sorted(r.id for r in answered) == sorted(rq.id for rq in sent)
    assert all(row.status == "ok" for r in answered for row in r.rows)
    assert decode(ResultMessage, before_restart[0].value).id == sent[0].id


def test_the_engine_command_exits_non_zero_when_its_engine_fails(broker, tmp_path):
    # A supervisor (compose's `restart:`) restarts an engine only if it exits non-zero.
    # The faulty backend joins `relstream engine` as any installed package's would,
    # through the relstream.backends entry point.
    import os
    import subprocess
    import sys
    from pathlib import Path

    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    dying = relquery(0)
    dying.id = f"dies-{dying.id}"
    asyncio.run(send(broker, topics, [dying]))
    registered = entry_point_folder(
        tmp_path, "relstream.backends", "faulty", "helpers:faulty_backend"
    )
    path = [str(registered), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    arguments = ["engine", "--backend", "faulty", "--bootstrap", broker.bootstrap]
    arguments += ["--prefix", topics.prefix, "--group", group, "--broker-kind", broker.kind]
    finished = subprocess.run(
        [sys.executable, "-m", "relstream", *arguments],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert finished.returncode == 1, finished.stderr[-2000:]
    assert "engine failed: the engine core died" in finished.stderr
    assert asyncio.run(committed(broker, topics, group)) is None  # replayed on restart


def test_a_partition_that_moved_away_leaves_the_lag_metrics():
    from prometheus_client import generate_latest

    from relstream.service.metrics import EngineMetrics

    metrics = EngineMetrics()
    metrics.observe_lag({0: 5, 1: 3})
    metrics.observe_lag({1: 2})  # partition 0 was revoked
    page = generate_latest(metrics.registry).decode()
    assert 'relstream_consumer_lag{partition="1"} 2.0' in page
    assert 'partition="0"' not in page


def test_metrics_reach_the_topic_and_the_prometheus_endpoint(broker):
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    from relstream.kafka.tools.brokers import free_port
    from relstream.wire import MetricsMessage

    topics, group, port = fresh_topics(), f"g{uuid.uuid4().hex[:6]}", free_port()
    sent = [relquery(i) for i in range(5)]
    rows_ok = ("relstream_rows_total", (("status", "ok"),))
    lag_0 = ("relstream_consumer_lag", (("partition", "0"),))

    def samples_of(page: str) -> dict:
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(page)
            for sample in family.samples
        }

    def settled(samples: dict) -> bool:
        """Every row counted, none in flight, and a lag of 0 measured (once a second)."""
        in_flight = samples.get(("relstream_rows_in_flight", ()))
        return samples.get(rows_ok) == 15 and samples.get(lag_0) == 0 and in_flight == 0

    async def scenario():
        await send(broker, topics, sent)
        config = config_for(broker, topics, group, metrics_port=port)
        stop = asyncio.Event()
        task = asyncio.create_task(KafkaService(config, SimRelQueryBackend()).run(stop))
        metrics = await read_messages(broker.bootstrap, topics.metrics, len(sent), broker.kind)
        deadline = time.monotonic() + 30  # else the last page read, for the asserts below
        while True:
            page = await asyncio.to_thread(
                lambda: urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
            )
            if settled(samples_of(page)) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.2)
        stop.set()
        await task
        return metrics, page

    metrics, page = asyncio.run(scenario())
    published = {m.relquery_id: m for m in (decode(MetricsMessage, x.value) for x in metrics)}
    assert set(published) == {rq.id for rq in sent}
    assert all(m.rows == {"ok": 3} and m.latency.total > 0 for m in published.values())
    samples = samples_of(page)
    assert samples[rows_ok] == 15
    assert samples[lag_0] == 0
    assert samples[("relstream_rows_in_flight", ())] == 0


@pytest.mark.slow
def test_a_cancel_message_stops_a_relquery_running_or_still_in_kafka(broker):
    # One relQuery at a time, served slowly (the simulated backend in 20x real time): one
    # runs and another waits behind it in the engine's backlog when both are cancelled by
    # message. Both results come, their rows "cancelled"; a third is answered as usual.
    from relstream.wire import ControlMessage

    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    running, early, normal = relquery(0), relquery(1), relquery(2)

    async def cancel(relquery_id: str) -> None:
        message = encode(ControlMessage(cancel=relquery_id))
        await produce(broker.bootstrap, topics.control, [(None, message)])

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        backend = SimRelQueryBackend(SimSettings(time_scale=20.0))
        service = KafkaService(config_for(broker, topics, group, max_backlog_rows=1), backend)
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        await send(broker, topics, [running])
        while running.id not in service._serving:
            await asyncio.sleep(0.05)
        await send(broker, topics, [early])
        await cancel(early.id)
        await cancel(running.id)
        await send(broker, topics, [normal])
        results = await read_messages(broker.bootstrap, topics.results, 3, broker.kind)
        stop.set()
        await task
        return {r.id: r for r in (decode(ResultMessage, m.value) for m in results)}

    results = asyncio.run(scenario())
    for cancelled in (running, early):
        assert [row.status for row in results[cancelled.id].rows] == ["cancelled"] * 3
    assert [row.status for row in results[normal.id].rows] == ["ok"] * 3
