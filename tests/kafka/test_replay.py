"""Dead letters go back where they came from once their cause is fixed: a query's
template typo dead-letters its rows; the registration is fixed; `relstream replay` sends
them back and every row ends in exactly one stored result."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from relstream import launch
from relstream.kafka.clients.aio import (
    DEAD_LETTER_ORIGINAL_BYTES,
    produce,
    read_messages,
)
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.replay import LetterFilter, parse_time, plan_replay
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend
from relstream.wire import DeadLetterMessage, RowMessage, decode, encode, validate
from relstream.wire.convert import dead_letter_message

REPO = Path(__file__).resolve().parents[2]
RELSTREAM = (sys.executable, "-m", "relstream")
ROWS = 6


def letter(reason: str, topic: str, at: float, truncated: bool = False) -> DeadLetterMessage:
    return DeadLetterMessage(
        original=b"x", truncated=truncated, key=b"k", topic=topic, reason=reason, at=at
    )


def test_letters_are_chosen_by_reason_origin_and_time_and_cut_ones_set_apart():
    letters = [
        letter("row 'a': the template names {reveiw}", "r.rows.reviews", 100.0),
        letter("row 'b': the template names {reveiw}", "r.rows.reviews", 200.0),
        letter("not valid msgpack", "r.rows.reviews", 150.0),
        letter("row 'c': the template names {reveiw}", "r.rows.reviews", 300.0, truncated=True),
        letter("row 'd': the template names {reveiw}", "r.relqueries", 250.0),
    ]
    plan = plan_replay(letters, LetterFilter(reason=r"\{reveiw\}", since=150.0))
    # a (too early) and the msgpack letter are not chosen; c is chosen but cut: its
    # original is to be read again where it came from (`refetch`).
    assert dict(plan.by_topic) == {"r.rows.reviews": 1, "r.relqueries": 1}
    assert (plan.count, len(plan.cut), plan.skipped) == (2, 1, 2)
    assert plan_replay(letters, LetterFilter(topic="r.relqueries", until=260.0)).count == 1
    with pytest.raises(ValueError, match="not a regular expression"):
        LetterFilter(reason="(")


def test_times_are_iso_or_seconds():
    assert parse_time("1764064800") == 1764064800.0
    assert parse_time("2025-11-25T10:00:00+00:00") == 1764064800.0
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_time("yesterday")


def write_query(path: Path, template: str) -> None:
    path.write_text(
        f'[[query]]\nname = "sentiment"\ntable = "reviews"\ntemplate = "{template}"\n'
        "window_seconds = 0.5\nmax_rows = 4\nmax_output_tokens = 4\n"
    )


def replay_cli(broker, topics, *options: str) -> str:
    command = [*RELSTREAM, "replay", "--bootstrap", broker.bootstrap, "--prefix", topics.prefix]
    command += ["--broker-kind", broker.kind, *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


@pytest.mark.slow
def test_a_fixed_template_takes_its_dead_letters_back(broker, tmp_path):
    topics = Topics(prefix=f"r{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    write_query(config, "Positive or negative? {reveiw}")  # the typo
    stream_bin = Path(os.environ.get("RELSTREAM_STREAM_BIN", REPO / ".venv-stream" / "bin"))
    worker_command = [str(stream_bin / "relstream")]
    app_id = f"worker-{uuid.uuid4().hex[:8]}"
    rows = [
        encode(validate(RowMessage, {"version": 1, "table": "reviews", "key": f"k{i}",
                                     "values": {"review": f"text {i}"}}))
        for i in range(ROWS)
    ]  # fmt: skip

    async def produce_rows():
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        for i, row in enumerate(rows):
            await producer.send_and_wait(topics.rows("reviews"), row, key=f"k{i}".encode())
        await producer.stop()

    async def setup():
        await create_topics(broker.bootstrap, topics.layout(("reviews",)))
        await produce_rows()
        return await read_messages(broker.bootstrap, topics.deadletter, ROWS, broker.kind, 60)

    worker = launch.start_worker(
        worker_command, broker, config, tmp_path / "w1.log", topics, app_id
    )
    try:
        letters = asyncio.run(setup())
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    assert len(letters) == ROWS
    # The cause is fixed; a dry run counts the letters and sends nothing.
    write_query(config, "Positive or negative? {review}")
    dry = replay_cli(broker, topics, "--dry-run", "--reason", "reveiw")
    assert f"would send {ROWS} dead letters back" in dry
    sink = tmp_path / "results.jsonl"

    async def serve_replayed():
        stop = asyncio.Event()
        service_config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"e-{uuid.uuid4().hex}", broker=broker.kind
        )
        service = asyncio.create_task(KafkaService(service_config, SimRelQueryBackend()).run(stop))
        worker = launch.start_worker(
            worker_command, broker, config, tmp_path / "w2.log", topics, app_id
        )
        try:
            sent = await asyncio.to_thread(replay_cli, broker, topics, "--reason", "reveiw")
            assert f"sent {ROWS} dead letters back" in sent
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                await asyncio.to_thread(
                    subprocess.run,
                    [*RELSTREAM, "sink", str(sink), "--bootstrap", broker.bootstrap, "--prefix",
                     topics.prefix, "--broker-kind", broker.kind],
                    capture_output=True, timeout=60, check=True,
                )  # fmt: skip
                keys = [row["key"] for line in sink.read_text().splitlines()
                        for row in json.loads(line)["rows"]] if sink.exists() else []  # fmt: skip
                if len(keys) >= ROWS:
                    return keys
                await asyncio.sleep(1)
            return keys
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
            stop.set()
            await service

    keys = asyncio.run(serve_replayed())
    assert sorted(keys) == [f"k{i}" for i in range(ROWS)]  # each row in exactly one result
    outputs = [
        row["output"] for line in sink.read_text().splitlines() for row in json.loads(line)["rows"]
    ]
    assert all(output.startswith("Positive or negative? text") for output in outputs)
    # After `replay` ("sent 6 dead letters back") `deadletters` listed them with nothing
    # saying they went back: now each is marked, and --waiting shows only the rest.
    reader = [*RELSTREAM, "deadletters", "--bootstrap", broker.bootstrap, "--prefix",
              topics.prefix]  # fmt: skip
    listed = subprocess.run(reader, capture_output=True, text=True, timeout=60).stdout
    said = " ".join(listed.split())
    assert said.count("[replayed 20") == ROWS and f"{ROWS} dead letters ({ROWS} of them" in said
    waiting = subprocess.run([*reader, "--waiting"], capture_output=True, text=True, timeout=60)
    said = " ".join(waiting.stdout.split())
    assert f"0 dead letters waiting ({ROWS} replayed not shown)" in said, said


def test_a_letter_too_large_to_keep_whole_goes_back_read_again_where_it_came(default_broker):
    # A relQuery of ~700 KB dead-lettered: the letter keeps its first 512 KiB and names
    # its rows' keys. Replay reads the original again at its offset and sends it back
    # whole; a letter whose original is no longer there (another message at its offset)
    # is counted as one that cannot go back.
    topics = Topics(prefix=f"r{uuid.uuid4().hex[:6]}.")
    big = b"r" * 700_000
    keys = [f"row-{i}" for i in range(3)]

    async def setup() -> DeadLetterMessage:
        bootstrap = default_broker.bootstrap
        await create_topics(bootstrap, topics.layout())
        await produce(bootstrap, topics.relqueries, [(b"q-1", big), (b"q-2", b"s")])
        at = {m.key: (m.partition, m.offset)
              for m in await read_messages(bootstrap, topics.relqueries, 2, default_broker.kind)}
        cut = dead_letter_message(big, topics.relqueries, *at[b"q-1"], "the engine failed",
                                  b"q-1", DEAD_LETTER_ORIGINAL_BYTES, keys)  # fmt: skip
        moved = dead_letter_message(big, topics.relqueries, *at[b"q-2"], "the engine failed",
                                    b"q-9", DEAD_LETTER_ORIGINAL_BYTES)  # fmt: skip
        await produce(bootstrap, topics.deadletter, [(None, encode(cut)), (None, encode(moved))])
        return cut

    cut = asyncio.run(setup())
    assert cut.truncated and cut.row_keys == keys and cut.row_count == 3
    said = " ".join(replay_cli(default_broker, topics).split())
    assert "sent 1 dead letters back" in said, said
    assert "1 of them held only the first bytes" in said, said
    assert "1 chosen letters cannot go back" in said and "(not kept there any more)" in said
    sent = asyncio.run(read_messages(default_broker.bootstrap, topics.relqueries, 3,
                                     default_broker.kind))  # fmt: skip
    assert sorted((m.key, len(m.value)) for m in sent) == [
        (b"q-1", 700_000), (b"q-1", 700_000), (b"q-2", 1)
    ]  # fmt: skip
    # The letter read again is marked as sent back; the one whose original is gone is not.
    waiting = subprocess.run(
        [*RELSTREAM, "deadletters", "--waiting", "--bootstrap", default_broker.bootstrap,
         "--prefix", topics.prefix], capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    said = " ".join(waiting.stdout.split())
    assert "1 dead letters waiting (1 replayed not shown)" in said, said


def test_a_letter_names_its_rows_keys_within_a_bound():
    keys = [f"{i:0>60}" for i in range(10_000)]  # 650 KB of keys
    letter = dead_letter_message(b"q", "rq", 0, 5, "failed", b"q", 100, keys)
    assert letter.row_count == 10_000 and 3_000 < len(letter.row_keys) < 10_000
    assert letter.row_keys == keys[: len(letter.row_keys)]
    assert len(encode(letter)) < 300 * 1024
    assert decode(DeadLetterMessage, encode(letter)).row_keys == letter.row_keys
