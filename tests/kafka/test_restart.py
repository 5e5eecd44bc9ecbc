"""A broker restart, as an operator does it: results, the broker stopped and started, more
rows for the same query. The sink stores every row's result once and no relQuery id comes
back; `relstream broker`'s default keeps every row and result across the restart, and
even a memory-only broker, whose offsets start over, gives new windows new ids."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from relstream import launch
from relstream.client import RelstreamClient
from relstream.connectors.sinks import JsonlSink
from relstream.kafka.clients.aio import assign_all, metadata_ok, read_messages
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import free_port
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend
from relstream.wire import ResultMessage, RowMessage, decode, encode

REPO = Path(__file__).resolve().parents[2]
QUERY = (
    '[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "Rate: {review}"\n'
    "window_seconds = 1.0\nmax_rows = 1\nmax_output_tokens = 4\n"
)


class BrokerCommand:
    """`relstream broker` as a user runs it, stopped with Ctrl-C's signal and started
    again on the same port (and, unless memory-only, the same data)."""

    def __init__(self, tmp_path: Path, memory: bool, prefix: str) -> None:
        self.port = free_port()
        self.kind = "tansu" if memory else "kafka"
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.log = tmp_path / "broker.log"
        self.args = [sys.executable, "-m", "relstream", "broker", "--port", str(self.port)]
        self.args += ["--prefix", prefix, "--table", "reviews"]
        self.args += ["--memory"] if memory else ["--data-dir", str(tmp_path / "data")]
        self.process: subprocess.Popen | None = None

    def start(self) -> str:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while "ready:" not in self.log.read_text().split("stopped")[-1]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"relstream broker did not start:\n{self.log.read_text()}")
            time.sleep(0.2)
        socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
        asyncio.run(metadata_ok(self.bootstrap))
        return self.log.read_text().split("stopped")[-1]

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(30)


def stream_bin() -> Path:
    path = Path(os.environ.get("RELSTREAM_STREAM_BIN", REPO / ".venv-stream" / "bin"))
    if not (path / "relstream").exists():
        pytest.fail(f"no Faust environment at {path}: run `make setup`")
    return path


def rows(*keys: str) -> list[tuple[bytes, bytes]]:
    made = [RowMessage(table="reviews", key=k, values={"review": f"text {k}"}) for k in keys]
    return [(row.key.encode(), encode(row)) for row in made]


async def serve(broker, topics: Topics, config: Path, log: Path, keys: tuple[str, ...]):
    """A worker and an engine (the same groups as before a restart, as restarted ones
    keep theirs) until the results topic answers every row in `keys`, all sent to
    partition 0 so that a memory-only broker's second life reuses its offsets."""
    worker = launch.start_worker(
        [str(stream_bin() / "relstream")], broker, config, log, topics, "restart-worker"
    )
    stop = asyncio.Event()
    service_config = ServiceConfig(broker.bootstrap, topics, "restart-engine", broker=broker.kind)
    service = asyncio.create_task(KafkaService(service_config, SimRelQueryBackend()).run(stop))
    try:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        for key, value in rows(*keys):
            await producer.send_and_wait(topics.rows("reviews"), value, key=key, partition=0)
        await producer.stop()
        answered: set[str] = set()
        async with asyncio.timeout(120):
            while not set(keys) <= answered:
                launch.check_alive([worker])
                count = len(answered) + 1
                for record in await read_messages(
                    broker.bootstrap, topics.results, count, broker.kind, 120
                ):
                    answered |= {row.key for row in decode(ResultMessage, record.value).rows}
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
        stop.set()
        await service


def sink(broker, prefix: str, path: Path) -> int:
    """`relstream sink results.jsonl` once: the results not yet stored, and how many."""
    store = JsonlSink(path)
    try:
        with RelstreamClient(broker.bootstrap, prefix, broker_kind=broker.kind) as client:
            return sum(store.write(result) for result in client.results("restart-sink"))
    finally:
        store.close()


async def topic_contents(broker, topics: Topics, results: int, rows_sent: int):
    result_ids = [
        decode(ResultMessage, r.value).id
        for r in await read_messages(broker.bootstrap, topics.results, results, broker.kind, 20)
    ]
    row_keys = [
        decode(RowMessage, r.value).key
        for r in await read_messages(
            broker.bootstrap, topics.rows("reviews"), rows_sent, broker.kind, 20
        )
    ]
    return result_ids, row_keys


async def records_in(broker, topic: str) -> int:
    """How many records `topic` holds, read to its end (not end minus start offsets:
    the commit marker of each transaction that wrote there takes an offset too)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=broker.bootstrap, isolation_level="read_committed"
    )
    await consumer.start()
    try:
        partitions = await assign_all(consumer, topic)
        await consumer.seek_to_beginning(*partitions)
        count = 0
        while batches := await consumer.getmany(timeout_ms=2000):
            count += sum(len(records) for records in batches.values())
        return count
    finally:
        await consumer.stop()


@pytest.mark.slow
@pytest.mark.parametrize("memory", [False, True], ids=["default-broker", "memory-broker"])
def test_a_broker_restart_loses_no_row_and_repeats_no_id(tmp_path, memory):
    prefix = f"r{uuid.uuid4().hex[:6]}."
    topics = Topics(prefix)
    config = tmp_path / "queries.toml"
    config.write_text(QUERY)
    command = BrokerCommand(tmp_path, memory, prefix)
    broker = SimpleNamespace(bootstrap=command.bootstrap, kind=command.kind)
    stored = tmp_path / "results.jsonl"
    try:
        banner = command.start()
        assert ("memory only" if memory else f"data in {tmp_path / 'data'}") in banner
        asyncio.run(serve(broker, topics, config, tmp_path / "worker1.log", ("a1", "a2")))
        assert sink(broker, prefix, stored) == 2
        before = [json.loads(line)["id"] for line in stored.read_text().splitlines()]

        command.stop()
        command.start()
        if not memory:  # the default broker kept every row and result
            result_ids, row_keys = asyncio.run(topic_contents(broker, topics, 2, 2))
            assert sorted(result_ids) == sorted(before)
            assert row_keys == ["a1", "a2"]
        asyncio.run(serve(broker, topics, config, tmp_path / "worker2.log", ("b1", "b2")))
        assert sink(broker, prefix, stored) == 2
        if not memory:  # the committed offsets survived too: nothing was served twice
            assert asyncio.run(records_in(broker, topics.results)) == 4
    finally:
        command.stop()

    lines = [json.loads(line) for line in stored.read_text().splitlines()]
    ids = [line["id"] for line in lines]
    assert len(set(ids)) == len(ids) == 4, ids  # no id came back after the restart
    assert not set(ids[2:]) & set(before)
    keys = sorted(row["key"] for line in lines for row in line["rows"])
    assert keys == ["a1", "a2", "b1", "b2"]  # every row's result, once
    if memory:  # offsets started over: only the timestamp tells the windows apart
        assert sorted(i.split("@")[0] for i in ids) == ["q-0-0", "q-0-0", "q-0-1", "q-0-1"]


@pytest.mark.slow
def test_a_service_starting_in_an_outage_waits_for_the_broker(tmp_path, caplog):
    # An engine SIGKILLed and restarted just before a broker restart passed its broker
    # check, then found no broker when its clients started, and exited (the short crash
    # drill, one run in twelve). A service's clients wait for the broker, saying so.
    import logging

    from relstream.kafka.clients.aio import new_consumer, new_producer
    from relstream.kafka.membership.static import start_waiting
    from relstream.kafka.tools.brokers import DEFAULT_BROKER, EmbeddedBroker

    port = free_port()
    topics = Topics(prefix="waits.")  # created by the broker as it starts
    broker = EmbeddedBroker(DEFAULT_BROKER, port=port, data_dir=tmp_path / "broker", topics=topics)
    caplog.set_level(logging.WARNING, logger="test.service")

    async def scenario():
        producer = new_producer(f"127.0.0.1:{port}")
        consumer = new_consumer(f"127.0.0.1:{port}", group_id="waits")
        consumer.subscribe([topics.relqueries])
        started = asyncio.ensure_future(start_waiting(
            None, logging.getLogger("test.service"), f"127.0.0.1:{port}", producer, consumer
        ))  # fmt: skip
        await asyncio.sleep(2.0)
        assert not started.done()
        await asyncio.to_thread(broker.start)
        try:
            assert await asyncio.wait_for(started, 60)
        finally:
            await producer.stop()
            await consumer.stop()

    try:
        asyncio.run(scenario())
    finally:
        broker.stop()
    assert any("no broker answers at 127.0.0.1" in r.getMessage() for r in caplog.records)


@pytest.mark.slow
def test_a_worker_started_while_the_broker_restarts_waits_for_it(tmp_path):
    # A worker SIGKILLed and restarted as the broker restarted found no broker and exited
    # (the short crash drill, one run in twelve). It waits, as an engine does.
    from relstream.kafka.tools.brokers import DEFAULT_BROKER, EmbeddedBroker

    port = free_port()
    broker = EmbeddedBroker(DEFAULT_BROKER, port=port, data_dir=tmp_path / "broker")
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "{review}"\n')
    ready = tmp_path / "worker.ready"
    worker = launch.start_worker([str(stream_bin() / "relstream")], broker, config,
                                 tmp_path / "worker.log", Topics(), "waits", ready)  # fmt: skip
    try:
        time.sleep(3.0)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        broker.start()
        try:
            launch.wait_ready([ready], [worker], 120)
        except RuntimeError as exc:  # it exited: what it said
            raise AssertionError(f"{exc}:\n{(tmp_path / 'worker.log').read_text()}") from None
    finally:
        worker.terminate()
        worker.wait(60)
        broker.stop()
