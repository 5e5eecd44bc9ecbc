"""`relstream usage` on each embedded broker: the metrics topic's relQueries in a period,
summed by query, load reports and other programs' records left out (docs/usage.md)."""

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid

from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.usage import usage_by_query
from relstream.wire import MetricsMessage, Usage, encode
from relstream.wire.messages import KIND_HEADER

USAGE = Usage(
    prompt_tokens=81, prefix_cached_tokens=32, output_tokens=7, answer_cached_rows=1,
    shared_rows=1,
)  # fmt: skip


def metrics(relquery_id: str, at: float, usage: Usage | None = USAGE) -> MetricsMessage:
    return MetricsMessage(
        relquery_id=relquery_id, latency=None, rows={"ok": 4, "error": 1},
        output_tokens=7 if usage is None else usage.output_tokens, policy="relstream",
        model="smollm2", engine="host:1", at=at, usage=usage,
    )  # fmt: skip


def publish(bootstrap: str, topics: Topics, now: float) -> None:
    from kafka import KafkaProducer

    asyncio.run(create_topics(bootstrap, topics.layout()))
    records = [  # (value, when, headers)
        (encode(metrics("reviews-0-0@1", now - 100)), now - 100, []),
        (encode(metrics("reviews-1-40@1", now - 50)), now - 50, []),
        (encode(metrics("adhoc", now - 40)), now - 40, []),
        (encode(metrics("reviews-0-9@1", now - 30, usage=None)), now - 30, []),  # older engine
        (encode(metrics("reviews-0-5@1", now - 7200)), now - 7200, []),  # before the period
        (b"not ours", now - 20, []),
        (b"a load report", now - 10, [(KIND_HEADER, b"load_report")]),
    ]
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for value, when, headers in records:
        producer.send(topics.metrics, value, timestamp_ms=int(when * 1000), headers=headers)
    producer.flush()
    producer.close()


def test_usage_sums_a_periods_relqueries_by_query(broker):
    topics, now = Topics(f"u{uuid.uuid4().hex[:6]}."), time.time()
    publish(broker.bootstrap, topics, now)
    report = usage_by_query(broker.bootstrap, topics, since=now - 3600)
    assert set(report.queries) == {"reviews", "(direct)"}
    reviews = report.queries["reviews"]
    assert (reviews.relqueries, reviews.rows, reviews.uncounted) == (3, 15, 1)
    assert (reviews.prompt_tokens, reviews.prefix_cached_tokens) == (162, 64)
    assert reviews.output_tokens == 21  # the older engine's output tokens counted too
    assert (reviews.answer_cached_rows, reviews.shared_rows) == (2, 2)
    assert report.queries["(direct)"].prompt_tokens == 81
    assert report.total().prompt_tokens == 243
    assert report.unreadable == 1 and not report.unread

    done = subprocess.run(
        [sys.executable, "-m", "relstream", "usage", "--bootstrap", broker.bootstrap,
         "--prefix", topics.prefix, "--since", "1h", "--json"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["query"] for line in lines] == ["reviews", "(direct)", "total"]
    assert lines[0]["prefix_cached_share"] == 64 / 162
    table = subprocess.run(
        [sys.executable, "-m", "relstream", "usage", "--bootstrap", broker.bootstrap,
         "--prefix", topics.prefix, "--since", "3h"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    # The longer period takes the older relQuery in too.
    [total] = [line for line in table.stdout.splitlines() if "total" in line]
    assert [cell.strip() for cell in total.split("│")[1:5]] == ["total", "5", "25", "324"]
    assert "1 of the relQueries came from engines that count no prompt tokens" in table.stdout
