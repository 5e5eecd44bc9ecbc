"""Three Apache Kafka nodes (`relstream broker --nodes 3`): the pipeline keeps its promises
while the leader of a results partition, and later the active controller, is SIGKILLed and
started again. Every row is answered, and a `read_committed` reader sees one result per
relQuery (docs/drills/kafka-three-nodes.md: its runs and what falls short)."""

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from engines import engine_process
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from relstream import launch
from relstream.kafka.clients.sync import sync_admin
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.kafka.tools.kafkadist import classpath, java

REPO = Path(__file__).resolve().parents[2]
JSON = [("content-type", b"application/json")]
WAIT_S = 120


def send_rows(bootstrap: str, topic: str, keys: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", retries=20)
    for key in keys:
        row = {"version": 1, "table": "reviews", "key": key, "values": {"review": f"r {key}"}}
        producer.send(topic, json.dumps(row).encode(), key.encode(), headers=JSON)
    producer.flush(timeout=60)
    producer.close()


def committed_results(bootstrap: str, topics: Topics, keys: set[str]) -> list[tuple[str, set]]:
    """(relQuery id, its row keys) of each result a read_committed reader sees, read until
    `keys` are all answered or `WAIT_S` pass."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", enable_auto_commit=False
    )
    parts = [TopicPartition(topics.results, p) for p in range(topics.partitions)]
    consumer.assign(parts)
    consumer.seek_to_beginning(*parts)
    seen: list[tuple[str, set]] = []
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline and not keys <= {k for _, ks in seen for k in ks}:
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    result = json.loads(record.value)
                    seen.append((result["id"], {r["key"] for r in result["rows"]}))
        for records in consumer.poll(timeout_ms=3000).values():  # anything after: twice?
            for record in records:
                result = json.loads(record.value)
                seen.append((result["id"], {r["key"] for r in result["rows"]}))
    finally:
        consumer.close()
    return seen


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    admin = sync_admin(bootstrap)
    try:
        [described] = admin.describe_topics([topic])
    finally:
        admin.close()
    return next(
        p["leader_id"] for p in described["partitions"] if p["partition_index"] == partition
    )


def active_controller(bootstrap: str) -> int:
    """The quorum's leader, as Kafka's own `kafka-metadata-quorum describe --status` says."""
    said = subprocess.run(
        [java(), "-cp", classpath(), "org.apache.kafka.tools.MetadataQuorumCommand",
         "--bootstrap-server", bootstrap, "describe", "--status"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    return int(re.search(r"LeaderId:\s+(\d+)", said).group(1))


@pytest.mark.slow
def test_three_nodes_lose_a_results_leader_and_the_controller_and_lose_nothing(tmp_path):
    topics = Topics(prefix=f"c{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "sentiment"\ntable = "reviews"\ntemplate = "Say: {review}"\n'
        'window_seconds = 0.5\nmax_rows = 5\nmax_output_tokens = 4\nresult_format = "json"\n'
    )
    stream_bin = Path(os.environ.get("RELSTREAM_STREAM_BIN", REPO / ".venv-stream" / "bin"))
    with EmbeddedBroker(
        "kafka", nodes=3, data_dir=tmp_path / "cluster", topics=topics, tables=("reviews",)
    ) as broker:
        cluster, bootstrap = broker.cluster, broker.bootstrap
        ready = tmp_path / "ready"
        worker = launch.start_worker(
            [str(stream_bin / "relstream")], broker, config, tmp_path / "worker.log", topics,
            f"w-{uuid.uuid4().hex[:6]}", ready,
        )  # fmt: skip
        engine = engine_process(broker, topics, f"e-{uuid.uuid4().hex[:6]}",
                                tmp_path / "engine.log", scale="0")  # fmt: skip
        try:
            launch.wait_ready([ready], [worker], 120)
            rows = topics.rows("reviews")
            send_rows(bootstrap, rows, [f"a{i}" for i in range(20)])
            # the leader of results[0], SIGKILLed while rows flow, then started again
            leader = cluster.members[leader_of(bootstrap, topics.results, 0) - 1]
            cluster.stop_node(leader, kill=True)
            send_rows(bootstrap, rows, [f"b{i}" for i in range(20)])
            cluster.start_node(leader)
            # then the active controller
            controller = cluster.members[active_controller(bootstrap) - 1]
            cluster.stop_node(controller, kill=True)
            send_rows(bootstrap, rows, [f"c{i}" for i in range(20)])
            cluster.start_node(controller)
            keys = {f"{batch}{i}" for batch in "abc" for i in range(20)}
            seen = committed_results(bootstrap, topics, keys)
        finally:
            for process in (worker, engine):
                process.terminate()
                process.wait(60)
    answered = {k for _, ks in seen for k in ks}
    assert keys <= answered, (
        sorted(keys - answered), (tmp_path / "engine.log").read_text()[-3000:]
    )
    ids = [relquery_id for relquery_id, _ in seen]
    assert len(ids) == len(set(ids)), "a relQuery answered twice"
    every = [k for _, ks in seen for k in ks]
    assert len(every) == len(set(every)), "a row in two results"
