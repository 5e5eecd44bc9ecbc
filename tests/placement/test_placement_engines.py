"""Placement by load on a real broker: three simulated engines in one group report their
load; one is four times slower, so relQueries submitted through the Python client, and
the worker's windows, go mostly to the other two; one engine SIGKILLed mid-stream loses
nothing and doubles nothing."""

import asyncio
import collections
import json
import time
import uuid

import pytest
from engines import answers_by, engine_process, keys_written, wait_for
from helpers import encode_row, sink_results, start_worker

from relstream.client import RelstreamClient
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.launch import wait_ready
from relstream.placement.readers import AsyncLoadReader, LoadReader
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.wire import RelQueryMessage, RelQueryRow

PARTITIONS = 6  # two for each engine
BEFORE_KILL, AFTER_KILL = 60, 30
EVERY_S = 0.1  # between two submits: about 10 relQueries a second


def submit(client, count, start, every_s=EVERY_S) -> list[str]:
    """`count` relQueries of 8 rows and 16 output tokens (0.8 s on the simulator)."""
    ids = []
    for i in range(start, start + count):
        rows = [{"key": f"r{i}-{k}", "values": {"city": f"city-{i}-{k}"}} for k in range(8)]
        ids.append(client.submit("Describe {city}.", rows, max_output_tokens=16))
        time.sleep(every_s)
    return ids


@pytest.mark.slow
def test_slow_engine_gets_few_relqueries_and_a_kill_loses_none(tmp_path):
    # On Tansu: noida-db 0.2.3 never evicts a SIGKILLed member from its group.
    topics = Topics(prefix=f"pl{uuid.uuid4().hex[:6]}.", partitions=PARTITIONS)
    group = f"engine-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "engines.log"
    with EmbeddedBroker("tansu") as broker:
        asyncio.run(create_topics(broker.bootstrap, topics.layout()))
        speeds = ("1", "1", "0.25")
        engines = [
            engine_process(
                broker, topics, group, log, budget_rows=4000,
                extra=["--load-reports", "--sim-speed", speed],
            )
            for speed in speeds
        ]  # fmt: skip
        slow, killed = engines[2], engines[0]
        client = RelstreamClient(broker.bootstrap, topics.prefix, broker_kind=broker.kind)
        reader = LoadReader(broker.bootstrap, topics)
        try:
            # Every engine reports and owns its partitions before the first submit.
            settled = wait_for(lambda: len(reader.engines()) == 3, 120)
            assert settled, f"engines reporting: {reader.engines()}\n{log.read_text()[-3000:]}"
            before = submit(client, BEFORE_KILL, 0)
            after = submit(client, AFTER_KILL // 2, BEFORE_KILL)
            killed.kill()  # SIGKILL mid-stream: no cleanup, no last commit
            killed.wait()
            after += submit(client, AFTER_KILL - AFTER_KILL // 2, BEFORE_KILL + AFTER_KILL // 2)
            sent = before + after
            answered = sink_results(broker, topics, sent, tmp_path / "results.jsonl", 60, 240)
            survivors = [engine.poll() for engine in engines[1:]]
            written = asyncio.run(keys_written(broker, topics.relqueries))
        finally:
            reader.close()
            client.close()
            for engine in engines:
                engine.terminate()
                engine.wait(30)
        answers = answers_by(broker, topics)
    assert survivors == [None, None], log.read_text()[-3000:]
    # Before the kill: the slow engine served far fewer than the hash's third.
    by_engine = collections.Counter(pid for pid, rq in answers if rq in set(before))
    share = by_engine[slow.pid] / len(before)
    assert share < 1 / 6, f"the slow engine served {share:.0%} of the relQueries: {by_engine}"
    assert all(by_engine[e.pid] > by_engine[slow.pid] for e in engines[:2]), by_engine
    # Every relQuery answered, and none twice in the sink.
    assert answered == set(sent), f"{len(set(sent) - answered)} relQueries never answered"
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["id"] for line in lines) == sorted(sent)
    # Placement wrote each relQuery once, to one partition. (An engine may still answer
    # one twice: one in flight when a rebalance takes its partition and hands it back is
    # read again; the same with hash placement. The sink keeps one.)
    assert written == collections.Counter(sent)


def test_an_engine_reports_its_partitions_and_an_asyncio_reader_places_by_them(broker):
    # The service's reporter and the reader an asyncio program (the worker) would use.
    topics = Topics(prefix=f"pa{uuid.uuid4().hex[:6]}.", partitions=3)
    message = RelQueryMessage(
        id="q1",
        template="Say {x}.",
        rows=[RelQueryRow(key="k", values={"x": "y"})],
        max_output_tokens=4,
        submitted_at=time.time(),
    )

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        reader = AsyncLoadReader(broker.bootstrap, topics, broker.kind)
        await reader.start()
        before = reader.book.partition_for(message)  # nobody reports yet: the hash
        config = ServiceConfig(
            broker.bootstrap, topics, f"g{uuid.uuid4().hex[:6]}", broker=broker.kind,
            load_report_s=0.2,
        )  # fmt: skip
        stop = asyncio.Event()
        backend = SimRelQueryBackend(SimSettings(time_scale=0.1))
        task = asyncio.create_task(KafkaService(config, backend).run(stop))
        try:
            async with asyncio.timeout(60):
                while not reader.book.engines():
                    await asyncio.sleep(0.2)
            placed = [reader.book.partition_for(message) for _ in range(6)]
        finally:
            stop.set()
            await task
            await reader.stop()
        return before, reader.book.engines(), placed

    before, engines, placed = asyncio.run(scenario())
    assert before is None
    assert len(engines) == 1
    # One engine owns all three partitions; its relQueries go round them.
    assert placed == [0, 1, 2, 0, 1, 2]


@pytest.mark.slow
def test_the_worker_places_its_windows_by_the_engines_load(tmp_path):
    # The worker's relQueries (windows of 8 rows) go where the client's do: mostly to the
    # two engines at full speed, each window written once.
    topics = Topics(prefix=f"pw{uuid.uuid4().hex[:6]}.", partitions=PARTITIONS)
    group = f"engine-{uuid.uuid4().hex[:6]}"
    log = tmp_path / "engines.log"
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "place"\ntable = "cities"\ntemplate = "Describe {city}."\n'
        "window_seconds = 30.0\nmax_rows = 8\nmax_output_tokens = 16\n"
    )
    windows = 48
    with EmbeddedBroker("tansu") as broker:
        asyncio.run(create_topics(broker.bootstrap, topics.layout()))
        engines = [
            engine_process(
                broker, topics, group, log, budget_rows=4000,
                extra=["--load-reports", "--sim-speed", speed],
            )
            for speed in ("1", "1", "0.25")
        ]  # fmt: skip
        slow = engines[2]
        reader = LoadReader(broker.bootstrap, topics)
        worker = None
        try:
            settled = wait_for(lambda: len(reader.engines()) == 3, 120)
            assert settled, f"engines reporting: {reader.engines()}\n{log.read_text()[-3000:]}"
            ready = tmp_path / "worker.ready"
            worker = start_worker(broker, topics, config, tmp_path / "worker.log", None, ready)
            wait_ready([ready], [worker], 120)  # windows come as they are produced, paced
            for window in range(windows):  # one rows partition: windows close at 8 rows
                rows = [
                    encode_row({"version": 1, "table": "cities", "key": f"w{window}-{k}",
                                "values": {"city": f"city-{window}-{k}"}})
                    for k in range(8)
                ]  # fmt: skip
                asyncio.run(produce_to(broker, topics.rows("cities"), rows))
                time.sleep(EVERY_S * 1.5)
            done = wait_for(lambda: len(keys_read(broker, topics.results)) >= windows, 240)
            assert done, (tmp_path / "worker.log").read_text()[-3000:]
            written = asyncio.run(keys_written(broker, topics.relqueries))
        finally:
            reader.close()
            if worker is not None:
                worker.terminate()
                worker.wait(30)
            for engine in engines:
                engine.terminate()
                engine.wait(30)
        answers = answers_by(broker, topics)
    assert len(written) == windows and set(written.values()) == {1}, written
    by_engine = collections.Counter(pid for pid, _ in answers)
    share = by_engine[slow.pid] / windows
    assert share < 1 / 6, f"the slow engine served {share:.0%} of the windows: {by_engine}"


async def produce_to(broker, topic: str, values: list[bytes]) -> None:
    """`values` to partition 0 of `topic`, in order."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


def keys_read(broker, topic) -> set[str]:
    """The keys written to `topic` so far."""
    return set(asyncio.run(keys_written(broker, topic)))
