"""Results people can join: `relstream sink --with-input` stores each row's input values
(read from the relqueries topic) and the query's name, in JSONL and CSV, for rows that
went through the worker and an engine on the simulated backend."""

import asyncio
import csv
import json
import signal
import subprocess
import sys
import time
import uuid

import pytest

from relstream import launch
from relstream.kafka.clients.aio import produce
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend
from relstream.wire import RowMessage, encode

ROWS = 6
VALUES = {f"k{i}": {"review": f"text {i}", "stars": i % 5} for i in range(ROWS)}


def sink_cli(broker, topics, target, *options: str) -> None:
    command = [sys.executable, "-m", "relstream", "sink", str(target), "--bootstrap"]
    command += [broker.bootstrap, "--prefix", topics.prefix, "--group", f"s-{target.suffix}"]
    # 120 s: a sink may itself wait up to 60 s for its group (`RelstreamClient.results`)
    subprocess.run([*command, *options], capture_output=True, timeout=120, check=True)


def jsonl_rows(path) -> list[dict]:
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [{"query": line["query"], **row} for line in lines for row in line["rows"]]


@pytest.mark.slow
def test_sinks_with_input_carry_the_input_columns_and_the_query(broker, tmp_path):
    topics = Topics(prefix=f"i{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "review-sentiment"\ntable = "reviews"\n'
        'template = "Positive or negative? {review}"\n'
        "window_seconds = 0.5\nmax_rows = 4\nmax_output_tokens = 4\n"
    )
    rows = [
        (key.encode(), encode(RowMessage(table="reviews", key=key, values=values)))
        for key, values in VALUES.items()
    ]
    asyncio.run(create_topics(broker.bootstrap, topics.layout(("reviews",))))
    asyncio.run(produce(broker.bootstrap, topics.rows("reviews"), rows))
    jsonl, table = tmp_path / "results.jsonl", tmp_path / "results.csv"

    async def pipeline():
        stop = asyncio.Event()
        service_config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"e-{uuid.uuid4().hex}", broker=broker.kind
        )
        service = asyncio.create_task(KafkaService(service_config, SimRelQueryBackend()).run(stop))
        worker = launch.start_worker(
            launch.relstream_command(True), broker, config, tmp_path / "w.log", topics,
            f"worker-{uuid.uuid4().hex[:8]}",
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while len(jsonl_rows(jsonl)) < ROWS and time.monotonic() < deadline:
                launch.check_alive([worker])
                await asyncio.to_thread(sink_cli, broker, topics, jsonl, "--with-input")
                await asyncio.sleep(0.5)
            await asyncio.to_thread(sink_cli, broker, topics, table, "--with-input")
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
            stop.set()
            await service

    asyncio.run(pipeline())
    stored = jsonl_rows(jsonl)
    assert sorted(row["key"] for row in stored) == sorted(VALUES)
    for row in stored:
        assert row["query"] == "review-sentiment"
        assert row["input"] == VALUES[row["key"]]  # every column, not only the template's
        assert row["output"].startswith("Positive or negative? text")
    with table.open(newline="") as handle:
        lines = list(csv.DictReader(handle))
    assert sorted(line["row_key"] for line in lines) == sorted(VALUES)
    for line in lines:
        values = VALUES[line["row_key"]]
        assert line["query"] == "review-sentiment"
        assert (line["input.review"], line["input.stars"]) == (
            values["review"],
            str(values["stars"]),
        )
