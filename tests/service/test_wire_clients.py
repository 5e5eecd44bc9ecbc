"""JSON rows from the Kafka clients other programs use, to Apache Kafka (`relstream broker`),
answered in JSON: kafka-python, confluent-kafka (librdkafka) and kcat (Debian's, librdkafka
2.0.2); Kafka's own console consumer reads one result per relQuery. A registration asks
for JSON results; the worker reads the rows by their header or their first byte; the
results carry `content-type: application/json` and each client reads them back
(docs/wire-format.md)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from engines import engine_process
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from relstream import launch
from relstream.client import RelstreamClient
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics

REPO = Path(__file__).resolve().parents[2]
JSON_HEADER = ("content-type", b"application/json")
WAIT_S = 90


@pytest.fixture(scope="module")
def pipeline(default_broker, tmp_path_factory):
    """A worker whose registration asks for JSON results, and a simulated engine."""
    import asyncio

    folder = tmp_path_factory.mktemp("pipeline")
    topics = Topics(prefix=f"j{uuid.uuid4().hex[:6]}.")
    asyncio.run(create_topics(default_broker.bootstrap, topics.layout(("reviews",))))
    config = folder / "queries.toml"
    config.write_text(
        '[[query]]\nname = "sentiment"\ntable = "reviews"\n'
        'template = "Positive or negative? {review}"\n'
        'window_seconds = 0.5\nmax_rows = 4\nmax_output_tokens = 4\nresult_format = "json"\n'
    )
    stream_bin = Path(os.environ.get("RELSTREAM_STREAM_BIN", REPO / ".venv-stream" / "bin"))
    ready = folder / "ready"
    worker = launch.start_worker(
        [str(stream_bin / "relstream")], default_broker, config, folder / "worker.log",
        topics, f"worker-{uuid.uuid4().hex[:8]}", ready,
    )  # fmt: skip
    engine = engine_process(
        default_broker, topics, f"e-{uuid.uuid4().hex[:8]}", folder / "engine.log", scale="0"
    )
    deadline = time.monotonic() + 120
    while not ready.exists() and time.monotonic() < deadline and worker.poll() is None:
        time.sleep(0.5)
    try:
        assert ready.exists(), (folder / "worker.log").read_text()[-2000:]
        yield default_broker, topics
    finally:
        for process in (worker, engine):
            process.send_signal(signal.SIGTERM)
            process.wait(30)


def row(key: str, review) -> bytes:
    values = {"review": review}
    return json.dumps({"version": 1, "table": "reviews", "key": key, "values": values}).encode()


def answered(results: list[dict]) -> dict[str, dict]:
    """Result rows by key, from JSON results joined by their parts."""
    return {r["key"]: r for result in results for r in result["rows"]}


def read_json_results(broker, topics, keys: set[str]) -> tuple[list[dict], list]:
    """The JSON results holding `keys` (kafka-python, no group) and their headers."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False)
    partitions = [TopicPartition(topics.results, p) for p in range(topics.partitions)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    results, headers = [], []
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline and not keys <= set(answered(results)):
            for records in consumer.poll(timeout_ms=500).values():
                for record in records:
                    result = json.loads(record.value)
                    if {r["key"] for r in result["rows"]} & keys:
                        results.append(result)
                        headers.append(record.headers)
    finally:
        consumer.close()
    return results, headers


@pytest.mark.slow
def test_kafka_python_json_rows_are_answered_in_json(pipeline, tmp_path):
    broker, topics = pipeline
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    keys = {"kp1", "kp2", "kp3"}
    producer.send(topics.rows("reviews"), row("kp1", "Dry feet."), key=b"kp1",
                  headers=[JSON_HEADER])  # fmt: skip
    for key in ("kp2", "kp3"):  # no header: detected by the leading {
        producer.send(topics.rows("reviews"), b"  " + row(key, f"Text {key}"), key=key.encode())
    producer.send(topics.rows("reviews"), row("kp-bad", [1]), key=b"kp-bad")
    producer.flush()
    producer.close()
    results, headers = read_json_results(broker, topics, keys)
    rows = answered(results)
    assert keys <= set(rows)
    assert rows["kp1"]["status"] == "ok"
    assert rows["kp1"]["output"].startswith("Positive or negative? Dry feet.")
    assert all(JSON_HEADER in list(h) for h in headers)
    assert all(result["version"] == 1 for result in results)
    # relstream's own readers read JSON results: `relstream sink` stores them whole.
    sink = tmp_path / "results.jsonl"
    subprocess.run(
        [sys.executable, "-m", "relstream", "sink", str(sink), "--bootstrap", broker.bootstrap,
         "--prefix", topics.prefix, "--broker-kind", broker.kind],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    stored = [json.loads(line) for line in sink.read_text().splitlines()]
    assert keys <= set(answered(stored))
    with RelstreamClient(broker.bootstrap, topics.prefix) as client:
        reasons = {letter.key: letter.reason for letter in client.dead_letters()}
    assert reasons[b"kp-bad"].startswith("row: field values[...]: expected `bool | int")


def test_confluent_kafka_json_rows_and_relquery_are_answered_in_json(pipeline):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    broker, topics = pipeline
    producer = confluent_kafka.Producer({"bootstrap.servers": broker.bootstrap})
    for key in ("ck1", "ck2"):
        producer.produce(topics.rows("reviews"), row(key, f"Text {key}"), key=key.encode(),
                         headers=[JSON_HEADER])  # fmt: skip
    relquery = {
        "version": 1, "id": "ck-adhoc", "template": "Say {word}", "max_output_tokens": 4,
        "rows": [{"key": "ck-a1", "values": {"word": "yes"}}], "submitted_at": time.time(),
        "result_format": "json",
    }  # fmt: skip
    producer.produce(topics.relqueries, json.dumps(relquery).encode(), key=b"ck-adhoc")
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": f"ck-{uuid.uuid4().hex[:8]}",
         "enable.auto.commit": False}
    )  # fmt: skip
    consumer.assign(
        [confluent_kafka.TopicPartition(topics.results, p, confluent_kafka.OFFSET_BEGINNING)
         for p in range(topics.partitions)]
    )  # fmt: skip
    keys, results = {"ck1", "ck2", "ck-a1"}, []
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline and not keys <= set(answered(results)):
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            assert (message.headers() or []).count(JSON_HEADER) == 1
            results.append(json.loads(message.value()))
    finally:
        consumer.close()
    rows = answered(results)
    assert keys <= set(rows)
    assert rows["ck-a1"]["output"].startswith("Say yes")
    assert any(result["id"] == "ck-adhoc" for result in results)


def test_kcat_json_rows_are_answered_in_json(pipeline):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (Debian: apt-get install kcat)")
    broker, topics = pipeline
    lines = "".join(f"{key}\t{row(key, f'Text {key}').decode()}\n" for key in ("kc1", "kc2"))
    subprocess.run(
        ["kcat", "-b", broker.bootstrap, "-P", "-t", topics.rows("reviews"), "-K", "\t",
         "-H", "content-type=application/json"],
        input=lines.encode(), check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    keys, seen = {"kc1", "kc2"}, {}
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and not keys <= set(seen):
        out = subprocess.run(
            ["kcat", "-b", broker.bootstrap, "-C", "-t", topics.results, "-o", "beginning",
             "-e", "-q", "-f", "%h\t%s\n"],
            check=True, capture_output=True, timeout=60,
        ).stdout.decode()  # fmt: skip
        for line in out.splitlines():
            header, value = line.split("\t", 1)
            result = json.loads(value)
            if {r["key"] for r in result["rows"]} & keys:
                assert header == "content-type=application/json"
                seen.update(answered([result]))
        time.sleep(0.5)
    assert keys <= set(seen)
    assert seen["kc1"]["output"].startswith("Positive or negative? Text kc1")


def test_kafkas_console_consumer_reads_one_result_per_relquery(pipeline):
    # Kafka's own consumer, from the jars `make setup` fetched, reading committed results
    # only: each relQuery's result once (a relQuery's result is one message here).
    from relstream.kafka.tools.kafkadist import classpath, java

    broker, topics = pipeline
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap)
    for key in ("cc1", "cc2", "cc3"):
        producer.send(topics.rows("reviews"), row(key, f"Text {key}"), key.encode(),
                      headers=[JSON_HEADER])  # fmt: skip
    producer.flush()
    producer.close()
    read_json_results(broker, topics, {"cc1", "cc2", "cc3"})  # answered by now
    out = subprocess.run(
        [java(), "-cp", classpath(), "org.apache.kafka.tools.consumer.ConsoleConsumer",
         "--bootstrap-server", broker.bootstrap, "--topic", topics.results,
         "--from-beginning", "--isolation-level", "read_committed", "--timeout-ms", "5000",
         "--property", "print.key=true", "--property", "key.separator=\t"],
        capture_output=True, timeout=120, text=True,
    )  # fmt: skip
    results = [line.split("\t", 1) for line in out.stdout.splitlines() if "\t" in line]
    ids = [relquery_id for relquery_id, _ in results]
    assert ids and len(ids) == len(set(ids)), out.stdout[-2000:] + out.stderr[-2000:]
    keys = {r["key"] for _, value in results for r in json.loads(value)["rows"]}
    assert {"cc1", "cc2", "cc3"} <= keys


PAGE = REPO / "docs" / "wire-format.md"
MARKED = re.compile(r"<!-- wire-test: (\S+) -->\n```(\w+)\n(.*?)\n```", re.S)


def page_block(name: str, broker, topics) -> str:
    """The page's block `name`, for this broker and topic prefix."""
    found = {block: text for block, _, text in MARKED.findall(PAGE.read_text())}
    return (
        found[name].replace("localhost:9092", broker.bootstrap).replace("relstream.", topics.prefix)
    )


@pytest.mark.parametrize(
    "name, expected", [("kafka-python", "'key': 'r2', 'status': 'ok'"), ("confluent-kafka", "A1")]
)
def test_the_wire_format_pages_python_runs_as_pasted(pipeline, name, expected):
    if name == "confluent-kafka":
        pytest.importorskip("confluent_kafka")
    broker, topics = pipeline
    done = subprocess.run(
        [sys.executable, "-c", page_block(name, broker, topics)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert expected in done.stdout


def test_the_wire_format_pages_kcat_runs_as_pasted(pipeline):
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (Debian: apt-get install kcat)")
    broker, topics = pipeline
    block = page_block("kcat", broker, topics)
    run = lambda text: subprocess.run(  # noqa: E731
        ["bash", "-euo", "pipefail", "-c", text], capture_output=True, text=True, timeout=60
    )
    done = run(block)
    assert done.returncode == 0, done.stderr
    reader = block.splitlines()[-1]  # read again until the row's result is there
    deadline = time.monotonic() + WAIT_S
    while '"key":"r1","status":"ok"' not in done.stdout and time.monotonic() < deadline:
        time.sleep(1)
        done = run(reader)
    assert '"key":"r1","status":"ok"' in done.stdout
    assert "content-type=application/json" in done.stdout
