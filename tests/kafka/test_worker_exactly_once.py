"""The worker exactly once by the broker's transactions (issue 39, item 1): a worker
SIGKILLed while windows are being published, restarted with the same command, leaves a
`read_committed` reader of the relqueries topic each window once and every row in
exactly one relQuery or dead letter (default broker, noida-db); on Tansu, which has no
transactions, the worker says once that it runs at least once, and windows rows."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import signal
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from helpers import encode_row, group_members, read_all, start_worker, until

from relstream.kafka.clients.aio import produce
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.launch import wait_ready
from relstream.stream.registrations import load_registrations
from relstream.stream.stage import StageSettings, WindowStage
from relstream.wire import DeadLetterMessage, RelQueryMessage, decode

QUERY = (
    '[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "Rate: {review}"\n'
    "window_seconds = 0.5\nmax_rows = 2\nmax_output_tokens = 4\n"
)
ROWS = 6000  # a backlog; every 7th row lacks its column (a dead letter)


def rows(start: int, stop: int) -> list[tuple[bytes, bytes]]:
    made = []
    for index in range(start, stop):
        key = f"r{index}"
        values = {} if index % 7 == 0 else {"review": key}
        made.append((key.encode(), encode_row({"version": 1, "table": "reviews", "key": key,
                                               "values": values})))  # fmt: skip
    return made


def wait_for_messages(broker, topic: str, within_s: float) -> None:
    """Until `topic` has messages, committed or not (its high watermark past 0)."""

    async def wait() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap)
        await consumer.start()
        try:
            partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)
                          or await _partitions(consumer, topic)]  # fmt: skip
            async with asyncio.timeout(within_s):
                while not any((await consumer.end_offsets(partitions)).values()):
                    await asyncio.sleep(0.02)
        finally:
            await consumer.stop()

    asyncio.run(wait())


async def _partitions(consumer, topic: str) -> set:
    await consumer._client.force_metadata_update()
    return consumer.partitions_for_topic(topic) or set()


def committed_view(broker, topics: Topics) -> tuple[collections.Counter, collections.Counter]:
    """Per window id, its relQueries; per row key, the relQueries and dead letters holding
    it; as a `read_committed` reader sees them."""

    async def read():
        relqueries = await read_all(broker.bootstrap, topics.relqueries, "read_committed", 2.0)
        letters = await read_all(broker.bootstrap, topics.deadletter, "read_committed", 2.0)
        return relqueries, letters

    relqueries, letters = asyncio.run(read())
    windows, keys = collections.Counter(), collections.Counter()
    for message in relqueries:
        relquery = decode(RelQueryMessage, message.value)
        windows[relquery.id] += 1
        keys.update(row.key for row in relquery.rows)
    for message in letters:
        keys[decode(DeadLetterMessage, message.value).key.decode()] += 1
    return windows, keys


def wait_for_all(broker, topics: Topics, within_s: float):
    deadline = time.monotonic() + within_s
    while True:
        windows, keys = committed_view(broker, topics)
        if len(keys) >= ROWS or time.monotonic() > deadline:
            return windows, keys
        time.sleep(1)


def stop(process) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except Exception:
            process.kill()
            process.wait(10)


@contextlib.asynccontextmanager
async def running_stage(registration, settings):
    """A window stage run in this process, joined and ready, until the block ends."""
    stage = WindowStage(registration, settings)
    running = asyncio.create_task(stage.run())
    try:
        async with asyncio.timeout(60):
            await stage.ready.wait()
        yield stage
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def topics_on(broker) -> Topics:
    made = Topics(prefix=f"w{uuid.uuid4().hex[:6]}.")
    asyncio.run(create_topics(broker.bootstrap, made.layout(("reviews",))))
    return made


@pytest.mark.slow
def test_a_worker_killed_mid_publish_and_restarted_cuts_each_window_once(default_broker, tmp_path):
    topics = topics_on(default_broker)
    config = tmp_path / "queries.toml"
    config.write_text(QUERY)
    app_id, log, ready = f"w-{uuid.uuid4().hex[:6]}", tmp_path / "worker.log", tmp_path / "ready"
    asyncio.run(produce(default_broker.bootstrap, topics.rows("reviews"), rows(0, ROWS)))
    worker = start_worker(default_broker, topics, config, log, app_id, ready)
    processes = [worker]
    try:
        wait_for_messages(default_broker, topics.relqueries, 120)  # windows being published
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        processes.append(start_worker(default_broker, topics, config, log, app_id, ready))
        windows, keys = wait_for_all(default_broker, topics, 120)
    finally:
        for process in processes:
            stop(process)
    text = log.read_text(errors="replace")
    twice = {window: n for window, n in windows.items() if n > 1}
    assert not twice, f"{len(twice)} windows published more than once, e.g. {list(twice)[:3]}"
    expected = {f"r{index}" for index in range(ROWS)}
    assert set(keys) == expected, f"{len(expected - set(keys))} rows missing:\n{text[-3000:]}"
    again = {key: n for key, n in keys.items() if n > 1}
    assert not again, f"{len(again)} rows in two relQueries or dead letters: {list(again)[:5]}"
    assert text.count("exactly once: windows and their offsets") == 2, text[-3000:]  # each run


@pytest.fixture(scope="module")
def tansu(tmp_path_factory):
    embedded = EmbeddedBroker("tansu", data_dir=tmp_path_factory.mktemp("tansu"))
    embedded.start()
    yield embedded
    embedded.stop()


@pytest.mark.slow
def test_without_transactions_the_worker_says_so_once_and_windows_rows(tansu, tmp_path):
    topics = topics_on(tansu)
    config = tmp_path / "queries.toml"
    config.write_text(QUERY)
    log, ready = tmp_path / "worker.log", tmp_path / "ready"
    worker = start_worker(tansu, topics, config, log, None, ready)
    try:
        wait_ready([ready], [worker], 120)
        asyncio.run(produce(tansu.bootstrap, topics.rows("reviews"), rows(1, 7)))
        deadline = time.monotonic() + 60
        while True:
            _, keys = committed_view(tansu, topics)
            if len(keys) >= 6 or time.monotonic() > deadline:
                break
    finally:
        stop(worker)
    text = log.read_text(errors="replace")
    assert set(keys) == {f"r{index}" for index in range(1, 7)}, text[-3000:]
    assert text.count("the broker has no transactions") == 1, text[-3000:]


BIG = (
    '[[query]]\nname = "big"\ntable = "reviews"\ntemplate = "Rate: {review}"\n'
    "window_seconds = 60\nmax_rows = 8\nmax_output_tokens = 4\n"
)


def test_a_window_refused_in_its_transaction_becomes_its_rows_dead_letters(
    default_broker, tmp_path
):
    """A stage told a limit above the broker's (3 MB; the producer takes 1 MiB) cuts a
    window of eight 200 KB rows that is refused: its transaction is redone with a dead
    letter for each row, and the stage goes on."""
    topics = topics_on(default_broker)
    config = tmp_path / "queries.toml"
    config.write_text(BIG)
    registration = load_registrations(config)[0]
    settings = StageSettings(default_broker.bootstrap, topics, f"g-{uuid.uuid4().hex[:6]}",
                             default_broker.kind, message_bytes=3_000_000)  # fmt: skip
    big = [
        (b"one partition", encode_row({"version": 1, "table": "reviews", "key": f"r{index}",
                                           "values": {"review": "x" * 200_000}}))
        for index in range(8)
    ]  # fmt: skip

    async def scenario():
        async with running_stage(registration, settings):
            await produce(default_broker.bootstrap, topics.rows("reviews"), big)
            for _ in range(60):
                letters = await read_all(default_broker.bootstrap, topics.deadletter,
                                         "read_committed", 1.0)  # fmt: skip
                if len(letters) >= 8:
                    break
        relqueries = await read_all(default_broker.bootstrap, topics.relqueries,
                                    "read_committed", 1.0)  # fmt: skip
        return letters, relqueries

    letters, relqueries = asyncio.run(scenario())
    keys = collections.Counter(decode(DeadLetterMessage, m.value).key.decode() for m in letters)
    assert keys == collections.Counter(f"r{index}" for index in range(8))
    assert relqueries == []


@pytest.mark.slow
def test_a_worker_behind_closes_a_window_by_the_clock_only_once_read_to_the_end(
    default_broker, tmp_path
):
    """Rows all stamped at one old instant, a backlog of several fetches: a stage that
    closed the open window by the clock at the end of each fetch cut windows at fetch
    boundaries, which a restart before the commit cuts again with more rows under the
    same id (found by the protocol model). Read to the end first, every window but the
    last is closed by rows, whole (the step takes 10,000 records at most)."""
    topics = topics_on(default_broker)
    config = tmp_path / "queries.toml"
    config.write_text(QUERY.replace("window_seconds = 0.5\nmax_rows = 2", "max_rows = 128"))
    registration = load_registrations(config)[0]
    settings = StageSettings(
        default_broker.bootstrap, topics, f"g-{uuid.uuid4().hex[:6]}", default_broker.kind
    )
    count, stamp_ms = 12_000, int((time.time() - 3600) * 1000)  # over one `getmany`

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        producer = AIOKafkaProducer(bootstrap_servers=default_broker.bootstrap, linger_ms=20)
        await producer.start()
        try:
            for index in range(count):
                row = {"version": 1, "table": "reviews", "key": f"r{index}",
                       "values": {"review": f"{index:05d}" + "x" * 300}}  # fmt: skip
                await producer.send(topics.rows("reviews"), encode_row(row), b"one partition",
                                    timestamp_ms=stamp_ms)  # fmt: skip
            await producer.flush()
        finally:
            await producer.stop()
        await asyncio.sleep(3.5)  # past every window's deadline and lateness, whatever the
        # broker stamps (its append time, or the producer's)
        async with running_stage(registration, settings):
            for _ in range(60):
                seen = await read_all(
                    default_broker.bootstrap, topics.relqueries, "read_committed", 1.0
                )
                sizes = [len(decode(RelQueryMessage, m.value).rows) for m in seen]
                if sum(sizes) >= count:
                    return sizes
        return sizes

    sizes = asyncio.run(scenario())
    assert sum(sizes) == count and set(sorted(sizes)[1:]) == {128}, sizes  # one short: the last


@pytest.mark.slow
def test_rows_at_offsets_a_broker_restarted_empty_reuses_are_windowed_not_skipped(
    tmp_path, monkeypatch
):
    """Issue 39, "Why" 3, the worker (at least once: Tansu, no transactions). A window
    published, its commit refused (the broker going away), the broker back EMPTY: rows at
    the same offsets were taken for a replay of the published window ("replayed as
    published, not sent again"), skipped and committed, with no relQuery and no dead
    letter. The book of published windows keys them by first offset and first row time."""
    from relstream.stream import stage as stage_module

    topics = Topics(prefix=f"e{uuid.uuid4().hex[:6]}.")
    broker = EmbeddedBroker("tansu", topics=topics, tables=("reviews",))
    broker.start()
    config = tmp_path / "queries.toml"
    config.write_text(QUERY)  # two rows a window
    registration = load_registrations(config)[0]
    settings = StageSettings(broker.bootstrap, topics, "empty-restart", broker.kind)
    refused, restarted = [], asyncio.Event()

    async def refused_until_restarted(consumer, offsets):  # the broker going away
        if offsets and not restarted.is_set():
            refused.append(offsets)
            return {}
        return await commit_assigned(consumer, offsets)

    commit_assigned = stage_module.commit_assigned
    monkeypatch.setattr(stage_module, "commit_assigned", refused_until_restarted)

    def two_rows(first: str) -> list[tuple[bytes, bytes]]:
        return [
            (b"one partition", encode_row({"version": 1, "table": "reviews", "key": key,
                                           "values": {"review": key}}))
            for key in (first, first + "b")
        ]  # fmt: skip

    async def relqueries(within_s: float) -> list[RelQueryMessage]:
        for _ in range(int(within_s)):
            seen = await read_all(broker.bootstrap, topics.relqueries, "read_committed", 1.0)
            if seen:
                return [decode(RelQueryMessage, m.value) for m in seen]
        return []

    async def scenario():
        async with running_stage(registration, settings):
            await produce(broker.bootstrap, topics.rows("reviews"), two_rows("old"))
            before = await relqueries(30)
            for _ in range(50):
                if refused:
                    break
                await asyncio.sleep(0.1)
            await asyncio.to_thread(broker.stop)
            await asyncio.to_thread(broker.start)  # empty, on the same port
            restarted.set()
            # The stage back in its group on the restarted broker (which knew none), so
            # from the offsets of the broker's new incarnation.
            await until(
                lambda: asyncio.to_thread(group_members, broker.bootstrap, settings.group),
                60,
                "the stage's group joined again",
            )
            await produce(broker.bootstrap, topics.rows("reviews"), two_rows("new"))
            after = await relqueries(60)
        return before, after, refused

    try:
        before, after, refused_commits = asyncio.run(scenario())
    finally:
        broker.stop()
    assert refused_commits and [[r.key for r in q.rows] for q in before] == [["old", "oldb"]]
    assert [[r.key for r in q.rows] for q in after] == [["new", "newb"]]
