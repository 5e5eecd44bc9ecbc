"""Rows produced → Faust windows → relQueries → engine service → results, through a real
broker. The worker runs from its own environment (.venv-stream), as in production."""

import asyncio
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import msgpack
import pytest
from aiokafka import AIOKafkaProducer
from helpers import encode_row, start_worker, stream_bin

from relstream import launch
from relstream.kafka.clients.aio import (
    MAX_REQUEST_BYTES,
    Subscription,
    assign_all,
    new_admin,
    new_consumer,
    new_producer,
    produce,
    read_messages,
)
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend
from relstream.wire import (
    DeadLetterMessage,
    LoadReportMessage,
    PartialResultMessage,
    RelQueryMessage,
    ResultMessage,
    RowMessage,
    decode,
    encode,
)
from relstream.wire.formats import decode_record, is_load_report
from relstream.wire.messages import MAX_ROW_BYTES

REPO = Path(__file__).resolve().parents[2]


def decode_result(message) -> ResultMessage:
    return decode(ResultMessage, message.value)


def decode_dead_letter(message) -> DeadLetterMessage:
    return decode(DeadLetterMessage, message.value)


HUGE = b"\xc1" + b"x" * 1_500_000
BIG_MESSAGE_BROKERS = ("tansu",)  # noida-db itself refuses messages over 1 MiB


@pytest.mark.slow
def test_rows_become_windowed_relqueries_and_results(broker, tmp_path):
    topics = Topics(prefix=f"s{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "sum"\ntable = "reviews"\ntemplate = "Summarise: {review}"\n'
        "window_seconds = 1.0\nmax_rows = 5\nmax_output_tokens = 8\n"
    )
    rows = [
        {"version": 1, "table": "reviews", "key": f"k{i}", "values": {"review": f"text {i}"}}
        for i in range(12)
    ]
    malformed = [
        b"\xc1",
        msgpack.packb({"version": 1, "table": "reviews"}),
        encode_row({"version": 1, "table": "reviews", "key": "x", "values": {"title": "no"}}),
    ]
    if broker.kind in BIG_MESSAGE_BROKERS:  # over the producer's limit: its letter is cut
        malformed.append(HUGE)

    async def scenario(worker_log: Path):
        await create_topics(broker.bootstrap, topics.layout(("reviews",)))
        worker = start_worker(broker, topics, config, worker_log)
        stop = asyncio.Event()
        service_config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"e-{uuid.uuid4().hex}", broker=broker.kind
        )
        service = asyncio.create_task(KafkaService(service_config, SimRelQueryBackend()).run(stop))
        try:
            producer = AIOKafkaProducer(
                bootstrap_servers=broker.bootstrap, max_request_size=4 << 20
            )
            await producer.start()
            # All to partition 0, so the windows are known: rows at offsets 0-11 (the
            # bad ones after them), windows of 5, 5 and 2 (the last closed by time).
            for row in rows:
                await producer.send_and_wait(
                    topics.rows("reviews"), encode_row(row), key=row["key"].encode(), partition=0
                )
            for bad in malformed:
                await producer.send_and_wait(topics.rows("reviews"), bad, key=b"bad", partition=0)
            await producer.stop()
            answered: dict[str, str] = {}
            # Every result read so far, by id: each read starts a new group and stops at
            # the count asked, so across 4 partitions a later read may miss one an earlier
            # read returned.
            results: dict[str, object] = {}
            async with asyncio.timeout(90):
                while len(answered) < len(rows):
                    batch = await read_messages(
                        broker.bootstrap, topics.results, len(results) + 1, broker.kind, 90
                    )
                    for message in batch:
                        result = decode(ResultMessage, message.value)
                        results[result.id] = message
                        for row in result.rows:
                            answered[row.key] = row.output
            dead = await read_messages(
                broker.bootstrap, topics.deadletter, len(malformed), broker.kind, 30
            )
            return answered, dead, list(results.values())
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
            stop.set()
            await service

    answered, dead, results = asyncio.run(scenario(tmp_path / "worker.log"))
    assert answered == {row["key"]: f"Summarise: {row['values']['review']}" for row in rows}
    # A window's id: query, partition, first offset, then @ its first row's timestamp.
    windows = {r.id: [row.key for row in r.rows] for r in map(decode_result, results)}
    assert all(re.fullmatch(r"sum-0-\d+@\d{13}", window) for window in windows), windows
    windows = {window.split("@")[0]: keys for window, keys in windows.items()}
    assert windows == {
        "sum-0-0": ["k0", "k1", "k2", "k3", "k4"],
        "sum-0-5": ["k5", "k6", "k7", "k8", "k9"],
        "sum-0-10": ["k10", "k11"],
    }
    reasons = [decode(DeadLetterMessage, m.value).reason for m in dead]
    assert any("msgpack" in r for r in reasons)
    assert any("'key' is a required" in r for r in reasons)
    assert any("{review}" in r for r in reasons)
    cut = [letter for letter in map(decode_dead_letter, dead) if letter.truncated]
    assert len(cut) == malformed.count(HUGE)
    assert all(c.original_size == len(HUGE) and HUGE.startswith(c.original) for c in cut)


BIG_ROW_CHARS = 200_000  # under the 256 KiB row limit; five make a window over 1 MiB


async def answered_or_dead(broker, topics, keys: set[str], worker, within_s: float):
    """Rows answered (key -> output) and dead-lettered (key -> reason) until every key is
    one or the other, `within_s` passed or the worker process ended."""
    consumer = new_consumer(broker.bootstrap, broker_kind=broker.kind)
    await consumer.start()
    answered: dict[str, str] = {}
    dead: dict[str, str] = {}
    try:
        await assign_all(consumer, topics.results, topics.deadletter)
        deadline = time.monotonic() + within_s
        while keys - answered.keys() - dead.keys() and time.monotonic() < deadline:
            if worker.poll() is not None:
                break
            for part, messages in (await consumer.getmany(timeout_ms=500)).items():
                for message in messages:
                    if part.topic == topics.results:
                        for row in decode_result(message).rows:
                            answered[row.key] = row.output
                    else:
                        letter = decode_dead_letter(message)
                        dead[letter.key.decode() if letter.key else "?"] = letter.reason
    finally:
        await consumer.stop()
    return answered, dead


def big_rows(count: int, small: int = 3) -> list[dict]:
    """`count` rows of 200 KB, then `small` small ones, of table "docs"."""
    big = [
        {"key": f"big{i}", "values": {"title": f"t{i}", "body": "ab"[i % 2] * BIG_ROW_CHARS}}
        for i in range(count)
    ]
    return big + [
        {"key": f"small{i}", "values": {"title": f"s{i}", "body": "x"}} for i in range(small)
    ]


def window_rows(broker, tmp_path, rows: list[dict], relqueries_limit: int | None = None):
    """The worker and a sim engine given `rows` (to partition 0 if `relqueries_limit`):
    (answered: key -> output, dead-lettered: key -> reason, the worker's exit code or
    None, its log). `relqueries_limit`: the relqueries topic's max.message.bytes, set
    once the worker runs (so after it asked the broker)."""
    topics = Topics(prefix=f"b{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "big"\ntable = "docs"\ntemplate = "Title: {title}"\n'
        "window_seconds = 5.0\nmax_rows = 100\nmax_output_tokens = 8\n"
    )
    worker_log, ready = tmp_path / "worker.log", tmp_path / "worker.ready"

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout(("docs",)))
        executable = [str(stream_bin() / "relstream")]
        worker = launch.start_worker(executable, broker, config, worker_log, topics, None, ready)
        stop = asyncio.Event()
        service_config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"e-{uuid.uuid4().hex}", broker=broker.kind
        )
        service = asyncio.create_task(KafkaService(service_config, SimRelQueryBackend()).run(stop))
        try:
            await asyncio.to_thread(launch.wait_ready, [ready], [worker], 60)
            if relqueries_limit is not None:
                await set_topic_config(
                    broker, topics.relqueries, {"max.message.bytes": str(relqueries_limit)}
                )
            messages = [
                (row["key"].encode(), encode_row({"version": 1, "table": "docs", **row}))
                for row in rows
            ]
            assert max(len(value) for _, value in messages) < MAX_ROW_BYTES
            partition = None if relqueries_limit is None else 0
            producer = new_producer(broker.bootstrap)
            await producer.start()
            for key, value in messages:
                await producer.send_and_wait(topics.rows("docs"), value, key, partition=partition)
            await producer.stop()
            keys = {row["key"] for row in rows}
            answered, dead = await answered_or_dead(broker, topics, keys, worker, 120)
            return answered, dead, worker.poll()
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
            stop.set()
            await service

    answered, dead, exited = asyncio.run(scenario())
    return answered, dead, exited, worker_log.read_text()


async def set_topic_config(broker, topic: str, configs: dict[str, str]) -> None:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = new_admin(broker.bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, configs)])
    finally:
        await admin.close()


def test_a_topics_message_limit_is_asked_of_the_broker_within_the_request_limit(broker):
    """What the worker cuts its windows under: a topic's own max.message.bytes, never over
    the producer's request limit (which is also what a broker telling none gets)."""
    from relstream.kafka.clients.limits import message_limit

    prefix = f"l{uuid.uuid4().hex[:6]}."
    small, plain = f"{prefix}small", f"{prefix}plain"

    async def limits():
        await create_topics(broker.bootstrap, {small: 1}, configs={"max.message.bytes": "300000"})
        await create_topics(broker.bootstrap, {plain: 1})
        return [await message_limit(broker.bootstrap, topic) for topic in (small, plain)]

    assert asyncio.run(limits()) == [300_000, MAX_REQUEST_BYTES]


@pytest.mark.slow
def test_rows_that_fit_alone_never_make_a_window_the_broker_refuses(default_broker, tmp_path):
    """24 rows of 200 KB (each under the row limit) and three small ones after them, on the
    default broker (it refuses messages over 1 MiB): windows are cut by bytes too, so every
    row is answered, the worker never stops and the broker refuses nothing."""
    rows = big_rows(24)
    answered, dead, exited, log = window_rows(default_broker, tmp_path, rows)
    assert exited is None, log[-3000:]
    assert not dead, dead
    assert answered == {row["key"]: f"Title: {row['values']['title']}" for row in rows}
    assert "refused" not in log and "TooLarge" not in log, log[-3000:]


@pytest.mark.slow
def test_a_window_the_broker_refuses_becomes_its_rows_dead_letters(default_broker, tmp_path):
    """The relqueries topic's limit lowered to 300,000 bytes after the worker asked for it:
    the first window (five 200 KB rows, 1 MB) is refused, and each of its rows is
    dead-lettered with the reason, naming it; the worker goes on and answers the rest."""
    rows = big_rows(6)
    answered, dead, exited, log = window_rows(default_broker, tmp_path, rows, 300_000)
    assert exited is None, log[-3000:]
    assert set(dead) == {f"big{i}" for i in range(5)}, (dead, log[-3000:])
    for key, reason in dead.items():
        assert reason.startswith(f"row {key!r}") and "MessageSizeTooLarge" in reason, reason
    assert answered == {
        key: f"Title: {title}"
        for key, title in [("big5", "t5")] + [(f"small{i}", f"s{i}") for i in range(3)]
    }


EXAMPLE_AGENTS = REPO / "docs" / "examples" / "enrich_reviews.py"


@pytest.mark.slow
def test_your_own_agent_filters_and_enriches_rows_before_they_are_windowed(broker, tmp_path):
    """docs/operations.md's example agent (`relstream worker --agents`) beside the window stage:
    an empty review never reaches a window, the others arrive trimmed and with a word
    count, and a message that is no row is dead-lettered by the stage with the reason."""
    topics = Topics(prefix=f"a{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "len"\ntable = "reviews"\ntemplate = "{review} ({words} words)"\n'
        "window_seconds = 1.0\nmax_rows = 2\nmax_output_tokens = 4\n"
    )
    raw = {"r1": "  Dry feet all week. ", "r2": "   ", "r3": "Too small"}

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout(("raw_reviews", "reviews")))
        executable = [str(stream_bin() / "relstream")]
        log, app_id = tmp_path / "worker.log", f"worker-{uuid.uuid4().hex[:8]}"
        worker = launch.start_worker(
            executable, broker, config, log, topics, app_id, agents=EXAMPLE_AGENTS
        )
        try:
            rows = [
                RowMessage(table="raw_reviews", key=key, values={"review": review})
                for key, review in raw.items()
            ]
            messages = [(row.key.encode(), encode(row)) for row in rows] + [(b"bad", b"\xc1")]
            await produce(broker.bootstrap, topics.rows("raw_reviews"), messages)
            windowed = {}
            subscription = Subscription(
                broker.bootstrap, topics.relqueries, broker_kind=broker.kind, timeout=90
            )
            async with subscription as relqueries:
                async for message in relqueries:
                    for row in decode(RelQueryMessage, message.value).rows:
                        windowed[row.key] = row.values
                    if len(windowed) >= 2:
                        break
            dead = await read_messages(broker.bootstrap, topics.deadletter, 1, broker.kind, 30)
            return windowed, dead
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)

    windowed, dead = asyncio.run(scenario())
    assert windowed == {
        "r1": {"review": "Dry feet all week.", "words": 4},
        "r3": {"review": "Too small", "words": 2},
    }
    (letter,) = map(decode_dead_letter, dead)
    assert letter.original == b"\xc1" and "msgpack" in letter.reason


@pytest.mark.slow
def test_demo_command_runs_the_whole_path(tmp_path):
    # It also shows each query's question once and what the latency columns mean, and
    # leaves no folder behind (it left its logs in the temp dir) unless asked to.
    import sys

    env = {**os.environ, "RELSTREAM_STREAM_BIN": str(stream_bin()), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "relstream", "demo", "--backend", "sim", "--timeout", "120"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    said = " ".join(result.stdout.split())
    assert "relQueries answered" in said
    assert "stopped worker, engine and broker" in said and "logs are in" not in said
    assert said.count("query defects asks of each row: Does this review report") == 1, said
    assert "(answers: Yes or No)" in said and "query summary asks of each row:" in said
    assert "waiting, until its first row's prefill" in said, said
    assert not list(tmp_path.glob("relstream-demo-*")), list(tmp_path.iterdir())


ESSAY_TOKENS = 48  # the essay runs to this limit; a capital stops after a few tokens
EARLY_BY_MS = 150  # France's partial precedes its relQuery's result by at least this


@pytest.mark.vllm
@pytest.mark.slow
def test_streaming_path_with_the_real_engine(tmp_path):
    """Rows → Faust → relQueries → vLLM CPU (relserve) → results, each answer on its row,
    each row published as a partial result as it finishes, before its relQuery's result:
    France's short answer reaches Kafka well before the essay in its window is done."""
    from relstream.engine.runtime import EngineSettings, VllmRuntime

    capitals = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Japan": "Tokyo"}
    topics = Topics(prefix=f"v{uuid.uuid4().hex[:6]}.")
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "capital"\ntable = "countries"\n'
        'template = "{question}"\n'
        f"window_seconds = 1.0\nmax_rows = 10\nmax_output_tokens = {ESSAY_TOKENS}\n"
    )
    questions = {
        country: f"What is the capital of {country}? Answer with the city name only."
        for country in capitals
    }
    # "essay" and "France" both hash to partition 2 of the rows topic: one window.
    questions["essay"] = "Write a long essay about the history of Europe."
    with EmbeddedBroker("kafka", data_dir=tmp_path / "broker") as broker:

        async def scenario():
            await create_topics(broker.bootstrap, topics.layout(("countries",)))
            worker = start_worker(broker, topics, config, tmp_path / "worker.log")
            engine = await VllmRuntime.start(EngineSettings(policy="relserve", report_load=True))
            stop = asyncio.Event()
            service_config = ServiceConfig(
                broker.bootstrap,
                topics,
                group_id=f"v-{uuid.uuid4().hex}",
                partial_results=True,
                load_report_s=0.25,
            )
            service = asyncio.create_task(KafkaService(service_config, engine).run(stop))
            serving_since = time.monotonic()
            try:
                producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
                await producer.start()
                for key, question in questions.items():
                    row = {
                        "version": 1,
                        "table": "countries",
                        "key": key,
                        "values": {"question": question},
                    }
                    await producer.send_and_wait(
                        topics.rows("countries"), encode_row(row), key=key.encode()
                    )
                await producer.stop()
                answered: dict[str, str] = {}
                # Every result seen, by relQuery id: each read starts over from the
                # earliest offsets but stops at `wanted` messages, so with several
                # partitions one read may miss a result an earlier read returned.
                results: dict[str, object] = {}
                wanted = 1
                async with asyncio.timeout(240):
                    while len(answered) < len(questions):
                        messages = await read_messages(
                            broker.bootstrap, topics.results, wanted, broker.kind, 240
                        )
                        wanted = len(messages) + 1
                        for message in messages:
                            result = decode(ResultMessage, message.value)
                            results[result.id] = message
                            for row in result.rows:
                                answered[row.key] = row.output
                partials = await read_messages(
                    broker.bootstrap, topics.partial_results, len(questions), broker.kind
                )
                # Every load report so far: four a second, and three a second are there.
                reported = int((time.monotonic() - serving_since) * 3)
                metrics = await read_messages(
                    broker.bootstrap, topics.metrics, reported, broker.kind
                )
                return answered, list(results.values()), partials, metrics
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
                stop.set()
                await service
                engine.shutdown()

        answered, results, partials, metrics = asyncio.run(scenario())
    for country, capital in capitals.items():
        assert capital in answered[country], (country, answered[country])
    # The engine reported its load as it served (vLLM's policy, out of its engine core),
    # owning the relqueries partitions, and its work while the windows ran.
    reports = [
        decode_record(LoadReportMessage, m.value, m.headers)
        for m in metrics
        if is_load_report(m.headers)
    ]
    assert reports and all(r.partitions == list(range(topics.partitions)) for r in reports)
    assert max(r.outstanding_s for r in reports) > 0, reports
    # Each row's partial result carries its own answer and was published (broker
    # timestamps, ms) no later than its relQuery's result, the first strictly before.
    finished = {decode(ResultMessage, m.value).id: m.timestamp for m in results}
    by_relquery: dict[str, list] = {}
    partial_of: dict[str, PartialResultMessage] = {}
    stamp_of: dict[str, int] = {}
    for message in partials:
        partial = decode(PartialResultMessage, message.value)
        assert partial.output == answered[partial.key]
        partial_of[partial.key], stamp_of[partial.key] = partial, message.timestamp
        by_relquery.setdefault(partial.relquery_id, []).append(message.timestamp)
    for relquery_id, stamps in by_relquery.items():
        assert max(stamps) <= finished[relquery_id]
    # A backend that knew only whole results would publish France's row with the essay's
    # result, milliseconds apart; decoding the essay's remaining tokens takes far longer.
    essay, france = partial_of["essay"], partial_of["France"]
    assert essay.relquery_id == france.relquery_id
    assert finished[essay.relquery_id] - stamp_of["France"] >= EARLY_BY_MS
