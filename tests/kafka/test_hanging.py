"""A transaction no coordinator will end (its writer SIGKILLed after noida-db restarted)
is aborted by the embedded broker, as Kafka's transaction timeout would; one the broker
lists as open is left to its writer."""

import asyncio
import signal
import subprocess
import sys
import time

import pytest
from aiokafka import AIOKafkaClient, AIOKafkaProducer, TopicPartition
from helpers import read_all, wait_until

from relstream.kafka.clients.aio import create_topics
from relstream.kafka.delivery.hanging import HangingTransactions
from relstream.kafka.tools.brokers import STORED_BROKER, EmbeddedBroker
from relstream_lab.drills.parts import noida_kafka

TOPIC = "hanging"
# A writer that opens a transaction, writes partition 0, and writes it again when told
# (after the test restarted the broker, which forgot the transaction meanwhile).
WRITER = """
import asyncio, sys
from aiokafka import AIOKafkaProducer

async def main(bootstrap):
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id="writer", enable_idempotence=True
    )
    await producer.start()
    await producer.begin_transaction()
    await (await producer.send("hanging", b"first", partition=0))
    print("sent", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await (await producer.send("hanging", b"again", partition=0))
    print("sent again", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main(sys.argv[1]))
"""


def _writer_killed_after_a_restart(broker: EmbeddedBroker) -> None:
    """The writer's second batch lands in the transaction the restart made the broker
    forget; then the writer is SIGKILLed, as in the crash drill."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, broker.bootstrap],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert writer.stdout.readline().strip() == "sent"
        noida_kafka(broker, "stop")
        noida_kafka(broker, "start")
        writer.stdin.write("go\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "sent again"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()


async def _commit(bootstrap: str, txn: str, value: bytes, partition: int = 0, hold=None):
    """The successor's commit (a new producer id: its fencing aborts nothing of the
    dead writer's); `hold` awaited inside the transaction."""
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, transactional_id=txn, enable_idempotence=True
    )
    await producer.start()
    try:
        async with producer.transaction():
            await (await producer.send(TOPIC, value, partition=partition))
            if hold is not None:
                await hold
    finally:
        await producer.stop()


async def _committed(bootstrap: str) -> list[bytes]:
    return [m.value for m in await read_all(bootstrap, TOPIC, "read_committed", idle_s=1.5)]


def test_a_dead_writers_forgotten_transaction_is_aborted_and_a_listed_one_left(tmp_path):
    broker = EmbeddedBroker(STORED_BROKER, data_dir=tmp_path / "broker", end_hanging=False)
    broker.start()
    try:
        asyncio.run(create_topics(broker.bootstrap, {TOPIC: 2}))
        _writer_killed_after_a_restart(broker)

        async def scenario():
            await _commit(broker.bootstrap, "writer", b"next")
            pinned = await _committed(broker.bootstrap)
            hanging = HangingTransactions(broker.bootstrap)
            client = AIOKafkaClient(bootstrap_servers=broker.bootstrap)
            await client.bootstrap()
            release = asyncio.get_running_loop().create_future()
            # A live writer's transaction stays open on partition 1 across both looks.
            live = asyncio.create_task(_commit(broker.bootstrap, "live", b"live", 1, release))
            await asyncio.sleep(1.0)
            try:
                first, second = await hanging.look(client), await hanging.look(client)
            finally:
                release.set_result(None)
                await live
                await client.close()
            return pinned, first, second, await _committed(broker.bootstrap)

        pinned, first, second, seen = asyncio.run(scenario())
        # Without the abort, nothing committed after the forgotten batch is readable.
        assert pinned == []
        assert first == []  # one look says nothing: a partition held across two is asked about
        assert [(h.partition, h.offset) for h in second] == [(TopicPartition(TOPIC, 0), 2)]
        assert sorted(seen) == [b"live", b"next"]  # the live one committed after the looks
    finally:
        broker.stop()


@pytest.mark.slow
def test_the_embedded_broker_ends_a_hanging_transaction_within_two_rounds(own_broker):
    asyncio.run(create_topics(own_broker.bootstrap, {TOPIC: 2}))
    _writer_killed_after_a_restart(own_broker)
    asyncio.run(_commit(own_broker.bootstrap, "writer", b"next"))
    wait_until(
        lambda: asyncio.run(_committed(own_broker.bootstrap)) == [b"next"],
        within_s=30.0, what="the successor's commit readable", every_s=1.0,
    )  # fmt: skip
    assert [h.offset for h in own_broker._hanging.aborted] == [2]


@pytest.mark.slow
def test_the_looks_leave_an_idle_brokers_store_unwritten(own_broker):
    # noida-db rewrites its whole store (103 MB after 100,000 rows) on ListTransactions:
    # asked every round, the idle broker wrote 20.9 MB/s. It is asked about held
    # partitions only.
    asyncio.run(create_topics(own_broker.bootstrap, {TOPIC: 2}))
    store = own_broker.data_path / "kafka.json"
    time.sleep(4.0)  # the topics' own write done
    before = store.stat().st_mtime_ns
    time.sleep(3 * 5.0)  # three looks
    assert store.stat().st_mtime_ns == before
