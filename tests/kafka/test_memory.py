"""Bounded memory under hostile and large input: a real worker and engine (sim backend)
on a real broker take messages of 5 MB (rows and relQueries refused by size or bounds)
and valid relQueries of about 5 MB and 20,000 rows each, several at once. Each process's
RSS is sampled every 0.1 s; its growth over the baseline after start-up stays under the
bound stated here, and every message is answered or dead-lettered.

Tansu: noida-db refuses messages over 1 MiB."""

import asyncio
import uuid

import pytest

from relstream.kafka.clients.aio import new_producer, read_messages, running
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.model import RelQuery, Row, Template
from relstream.service.backlog import RowBudget
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.wire import ResultMessage, decode, encode
from relstream.wire.convert import relquery_message
from relstream_lab.drills.flood import RSS_BOUND_MB, report_table, run_flood


@pytest.mark.slow
def test_large_and_oversize_messages_keep_engine_and_worker_memory_bounded(tmp_path):
    with EmbeddedBroker("tansu", data_dir=tmp_path / "broker") as broker:
        report = run_flood(
            broker, tmp_path, count=300, seed=3, big_each=2, valid_relqueries=10,
            valid_rows=50, timeout=300, large=4, large_rows=20_000,
        )  # fmt: skip
    table = report_table(report)
    assert report.valid_sent == 14 and report.sent["relquery template 5 MB"] == 2, table
    assert report.lettered == report.sent, table  # every bad message, with its reason
    assert report.valid_answered == report.valid_sent, table  # the four large ones too
    assert report.rows_answered == report.rows_sent == 50, table
    assert report.alive == {"engine": True, "worker": True}, table
    # The drill's bounds (docs/drills/flood.md says what the engine's growth is made of).
    for process, bound in RSS_BOUND_MB.items():
        assert report.rss_growth_mb(process) < bound, table


def test_the_rows_held_stay_under_the_limit_whatever_the_charges():
    budget = RowBudget(20_000, held_limit=30_000)
    for name in ("a", "b", "c"):
        budget.offer(20_000, name)  # each charged 5,000: all three fit the budget
    assert budget.admit() == ["a"]  # b would hold 40,000 rows
    assert budget.held == 20_000 and budget.full
    budget.release(20_000)
    assert budget.admit() == ["b"] and budget.held == 20_000
    budget.release(20_000)
    assert budget.admit() == ["c"] and not budget.full
    alone = RowBudget(20_000, held_limit=10_000)
    alone.offer(50_000, "large")  # larger than the limit: admitted when nothing is held
    assert alone.admit() == ["large"] and alone.held == 50_000
    assert RowBudget(20_000).held_limit == 120_000  # the budget plus the largest relQuery


@pytest.mark.slow
def test_the_engine_decodes_no_more_than_one_relquery_beyond_its_budget(default_broker):
    # Budget 100 rows: each 50-row relQuery is charged 25, so four run and a fifth waits.
    # The 40 relQueries sit in one partition; a fetch takes up to 64 of them. Without the
    # seek back, every one fetched would be decoded and wait in memory.
    broker = default_broker
    topics = Topics(prefix=f"t{uuid.uuid4().hex[:6]}.", partitions=1)
    sent = [
        RelQuery(f"held-{i}", Template("Describe {city}."), [Row(f"r{k}", {"city": f"c{i}-{k}"})
                 for k in range(50)], 5)
        for i in range(40)
    ]  # fmt: skip
    waiting_seen: list[int] = []

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        async with running(producer := new_producer(broker.bootstrap)):
            for rq in sent:
                await producer.send(topics.relqueries, encode(relquery_message(rq)))
            await producer.flush()
        config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"engine-{uuid.uuid4().hex}",
            broker=broker.kind, max_backlog_rows=100,
        )  # fmt: skip
        service = KafkaService(config, SimRelQueryBackend(SimSettings(time_scale=0.2)))
        stop = asyncio.Event()
        serving = asyncio.create_task(service.run(stop))
        results = asyncio.create_task(
            read_messages(broker.bootstrap, topics.results, len(sent), broker.kind)
        )
        while not results.done():
            waiting_seen.append(len(service.budget.waiting))
            await asyncio.sleep(0.01)
        stop.set()
        await serving
        return results.result()

    results = asyncio.run(scenario())
    assert {decode(ResultMessage, m.value).id for m in results} == {rq.id for rq in sent}
    assert max(waiting_seen) == 1, waiting_seen  # one waited, never more
