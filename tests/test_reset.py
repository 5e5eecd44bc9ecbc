"""`relstream reset` moves a stopped worker's query group, as kafka-consumer-groups
--reset-offsets does: reset to earliest, the next worker windows every row again; refused
while a worker runs the group; a dry run prints the moves and commits nothing."""

import asyncio
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaAdminClient

from relstream import launch
from relstream.kafka.bounds import Span, extents, partitions
from relstream.kafka.clients import create_topics, produce
from relstream.kafka.reset import ResetTarget, parse_target
from relstream.kafka.sync import sync_consumer
from relstream.kafka.topics import Topics
from relstream.schemas import RelQueryMessage, RowMessage, decode, encode

ROWS = 10
QUERY = "sentiment"


def test_targets_are_words_offsets_or_iso_times():
    assert parse_target("Earliest") == ResetTarget("earliest")
    assert parse_target("latest") == ResetTarget("latest")
    assert parse_target("42") == ResetTarget("offset", 42)
    assert parse_target("2025-11-25T10:00:00+00:00") == ResetTarget("time", 1764064800.0)
    with pytest.raises(ValueError, match="not earliest, latest, an offset"):
        parse_target("yesterday")


def rows_windowed(bootstrap: str, topic: str) -> int:
    """Rows in every relQuery on `topic` now."""
    consumer = sync_consumer(bootstrap, enable_auto_commit=False)
    try:
        found = extents(consumer, partitions(consumer, [topic]))
        span = Span(consumer, {p: (e.start, e.end) for p, e in found.items()}, None)
        return sum(len(decode(RelQueryMessage, record.value).rows) for record in span)
    finally:
        consumer.close()


def committed(bootstrap: str, group: str) -> dict[int, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
        return {p.partition: o.offset for p, o in offsets.items()}
    finally:
        admin.close()


def wait_for(check, what: str, worker: subprocess.Popen, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        launch.check_alive([worker])
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.5)


def reset_cli(broker, topics, config, app_id, *options: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "relstream", "reset", QUERY, "--bootstrap", broker.bootstrap]
    command += ["--prefix", topics.prefix, "--app-id", app_id, *options]
    if config is not None:
        command += ["--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_a_reset_query_is_windowed_again_and_never_while_its_worker_runs(broker, tmp_path):
    topics = Topics(prefix=f"z{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    config.write_text(
        f'[[query]]\nname = "{QUERY}"\ntable = "reviews"\ntemplate = "Say {{r}}"\n'
        "window_seconds = 0.5\nmax_rows = 4\nmax_output_tokens = 4\n"
    )
    app_id = f"worker-{uuid.uuid4().hex[:8]}"
    group = f"{app_id}-{QUERY}"
    rows = [
        (f"k{i}".encode(), encode(RowMessage(table="reviews", key=f"k{i}", values={"r": f"{i}"})))
        for i in range(ROWS)
    ]
    asyncio.run(create_topics(broker.bootstrap, topics.layout(("reviews",))))
    asyncio.run(produce(broker.bootstrap, topics.rows("reviews"), rows))
    after_rows = datetime.now(UTC).isoformat()
    worker_command = launch.relstream_command(True)

    def start_worker(log: str) -> subprocess.Popen:
        return launch.start_worker(worker_command, broker, config, tmp_path / log, topics, app_id)

    worker = start_worker("w1.log")
    try:
        wait_for(
            lambda: sum(committed(broker.bootstrap, group).values()) == ROWS, "committed", worker
        )
        assert rows_windowed(broker.bootstrap, topics.relqueries) == ROWS
        busy = reset_cli(broker, topics, config, app_id, "--to", "earliest")
        assert busy.returncode == 1
        assert f"group {group} has 1 active member(s) (" in busy.stderr, busy.stderr
        assert len(busy.stderr.strip().splitlines()) == 1
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    before = committed(broker.bootstrap, group)
    if broker.kind == "tansu":  # it keeps listing the stopped worker, and refuses a commit
        kept = reset_cli(broker, topics, config, app_id, "--to", "earliest")
        assert f"group {group} has 1 active member(s)" in kept.stderr, kept.stderr
        assert committed(broker.bootstrap, group) == before
        return
    ends = dict.fromkeys(range(topics.partitions), 0)  # a partition with no rows
    # The dry run prints every partition's move and commits nothing; without --config the
    # topic is the one the group committed on.
    dry = reset_cli(broker, topics, None, app_id, "--to", "earliest", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    for partition, offset in before.items():
        assert f"{topics.rows('reviews')}[{partition}]: {offset} -> 0" in dry.stdout
    assert "dry run: nothing committed" in dry.stdout
    assert committed(broker.bootstrap, group) == before
    # A time after every row is each partition's end; an offset past the end is the end.
    later = reset_cli(broker, topics, config, app_id, "--to", after_rows, "--dry-run")
    assert later.returncode == 0, later.stderr
    assert all(f"]: {offset} -> {offset}" in later.stdout for offset in before.values()), (
        later.stdout
    )
    moved = reset_cli(broker, topics, config, app_id, "--to", "earliest")
    assert moved.returncode == 0, moved.stderr
    # every partition of the topic moves, those the group never committed on included
    assert committed(broker.bootstrap, group) == dict.fromkeys(range(topics.partitions), 0)
    worker = start_worker("w2.log")
    try:
        wait_for(
            lambda: rows_windowed(broker.bootstrap, topics.relqueries) == 2 * ROWS,
            "re-windowed",
            worker,
        )
        wait_for(
            lambda: committed(broker.bootstrap, group) == {**ends, **before},
            "committed again",
            worker,
        )
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert not (Path.cwd() / f"{app_id}-data").exists()  # Faust's data is not left here
