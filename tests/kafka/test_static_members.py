"""Static group membership on the default broker (noida-db), which never evicts a member
killed with SIGKILL: an engine or a worker SIGKILLed and started again with the same
command serves again within 30 s; of two engines in one group, one killed and restarted,
every relQuery is answered, and one stopped gracefully hands its partitions to the other
at once; a process waiting for its group says what it waits for and ends on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from engines import engine_process
from helpers import encode_row, relquery, start_worker

from relstream.kafka.clients.aio import Subscription, produce
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.launch import stop_all, wait_ready
from relstream.wire import ResultMessage, decode, encode
from relstream.wire.convert import relquery_message

SERVES_AGAIN_S = 30  # from the restart to the last relQuery produced after it answered
STOPS_S = 10  # from SIGTERM to the process's end
QUERY = (
    '[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "Rate: {review}"\n'
    "window_seconds = 0.5\nmax_rows = 2\nmax_output_tokens = 4\n"
)


@pytest.fixture
def topics(default_broker) -> Topics:
    made = Topics(prefix=f"m{uuid.uuid4().hex[:6]}.")
    asyncio.run(create_topics(default_broker.bootstrap, made.layout(("reviews",))))
    return made


def send_relqueries(broker, topics: Topics, count: int, every_partition: bool = False) -> set:
    """`count` small relQueries (with `every_partition`, `count` on each partition of the
    relqueries topic); their ids."""
    sent = [
        relquery(index) for index in range(count * (topics.partitions if every_partition else 1))
    ]
    messages = [(rq.id.encode(), encode(relquery_message(rq))) for rq in sent]

    async def send() -> None:
        from aiokafka import AIOKafkaProducer

        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
        await producer.start()
        try:
            for index, (key, value) in enumerate(messages):
                partition = index % topics.partitions if every_partition else None
                await producer.send_and_wait(topics.relqueries, value, key, partition=partition)
        finally:
            await producer.stop()

    asyncio.run(send())
    return {rq.id for rq in sent}


def send_rows(broker, topics: Topics, keys: list[str]) -> None:
    rows = [
        (
            key.encode(),
            encode_row({"version": 1, "table": "reviews", "key": key, "values": {"review": key}}),
        )
        for key in keys
    ]
    asyncio.run(produce(broker.bootstrap, topics.rows("reviews"), rows))


def answered(broker, topics: Topics, within_s: float, wanted=None, rows=None) -> tuple[set, set]:
    """Result ids and row keys read from the results topic until every id of `wanted`
    (or key of `rows`) is there or `within_s` passed."""
    ids: set[str] = set()
    keys: set[str] = set()

    async def read() -> None:
        subscription = Subscription(
            broker.bootstrap, topics.results, broker_kind=broker.kind, timeout=within_s
        )
        async with subscription as results:
            async for message in results:
                result = decode(ResultMessage, message.value)
                ids.add(result.id)
                keys.update(row.key for row in result.rows)
                if (wanted is None or wanted <= ids) and (rows is None or rows <= keys):
                    return

    with contextlib.suppress(TimeoutError):
        asyncio.run(read())
    return ids, keys


def started(process: subprocess.Popen, ready: Path, log: Path) -> subprocess.Popen:
    try:
        wait_ready([ready], [process], 120)
    except RuntimeError as exc:
        pytest.fail(f"{exc}:\n{log.read_text(errors='replace')[-3000:]}")
    return process


def engine(broker, topics, group, log: Path, ready: Path, extra=()) -> subprocess.Popen:
    """`relstream engine --backend sim`, started as a user does (ready once it joined)."""
    process = engine_process(broker, topics, group, log, ready_file=ready, extra=extra)
    return started(process, ready, log)


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait(10)


def stop(processes: list[subprocess.Popen]) -> None:
    stop_all(processes)


def test_a_sigkilled_engine_restarted_with_the_same_command_serves_within_30_s(
    default_broker, topics, tmp_path
):
    group, log, ready = f"e-{uuid.uuid4().hex[:6]}", tmp_path / "engine.log", tmp_path / "ready"
    first = engine(default_broker, topics, group, log, ready)
    processes = [first]
    try:
        before = send_relqueries(default_broker, topics, 4)
        assert before <= answered(default_broker, topics, 60, before)[0], log.read_text()[-3000:]
        kill(first)
        restarted_at = time.monotonic()
        processes.append(engine_process(default_broker, topics, group, log, ready_file=ready))
        after = send_relqueries(default_broker, topics, 2, every_partition=True)
        ids, _ = answered(default_broker, topics, SERVES_AGAIN_S, after)
        took = time.monotonic() - restarted_at
        assert after <= ids and took < SERVES_AGAIN_S, (
            f"{len(after - ids)} of {len(after)} unanswered {took:.0f} s after the restart:\n"
            + log.read_text()[-3000:]
        )
    finally:
        stop(processes)


@pytest.mark.slow
def test_a_sigkilled_worker_restarted_with_the_same_command_serves_within_30_s(
    default_broker, topics, tmp_path
):
    config = tmp_path / "queries.toml"
    config.write_text(QUERY)
    app_id, log, ready = f"w-{uuid.uuid4().hex[:6]}", tmp_path / "worker.log", tmp_path / "ready"
    serving = engine(default_broker, topics, f"e-{uuid.uuid4().hex[:6]}", tmp_path / "e.log",
                     tmp_path / "engine.ready")  # fmt: skip
    worker = start_worker(default_broker, topics, config, log, app_id, ready)
    processes = [serving, worker]
    try:
        started(worker, ready, log)
        send_rows(default_broker, topics, ["a1", "a2"])
        keys = answered(default_broker, topics, 60, rows={"a1", "a2"})[1]
        assert {"a1", "a2"} <= keys, log.read_text()[-3000:]
        kill(worker)
        restarted_at = time.monotonic()
        processes.append(start_worker(default_broker, topics, config, log, app_id, ready))
        after = {f"b{index}" for index in range(8)}
        send_rows(default_broker, topics, sorted(after))
        keys = answered(default_broker, topics, SERVES_AGAIN_S, rows=after)[1]
        took = time.monotonic() - restarted_at
        assert after <= keys and took < SERVES_AGAIN_S, (
            f"{len(after - keys)} of {len(after)} rows unanswered {took:.0f} s after the "
            f"restart:\n" + log.read_text(errors="replace")[-3000:]
        )
    finally:
        stop(processes)


@pytest.mark.slow
def test_of_two_engines_one_killed_and_restarted_then_the_other_stopped_all_are_answered(
    default_broker, topics, tmp_path
):
    # Two engines started with the same command on one host hold two instance ids; the
    # killed one, restarted, takes its own id and partitions back. Then the other stops
    # gracefully and leaves the group: the restarted one takes every partition at once.
    group = f"e-{uuid.uuid4().hex[:6]}"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    readies = [tmp_path / "a.ready", tmp_path / "b.ready"]
    engines = [engine(default_broker, topics, group, logs[i], readies[i]) for i in range(2)]
    processes = list(engines)
    try:
        first = send_relqueries(default_broker, topics, 2, every_partition=True)
        assert first <= answered(default_broker, topics, 60, first)[0]
        kill(engines[1])
        restarted_at = time.monotonic()
        restarted = engine_process(default_broker, topics, group, logs[1], ready_file=readies[1])
        processes.append(restarted)
        second = send_relqueries(default_broker, topics, 3, every_partition=True)
        ids, _ = answered(default_broker, topics, SERVES_AGAIN_S, second)
        took = time.monotonic() - restarted_at
        assert second <= ids and took < SERVES_AGAIN_S, (
            f"{len(second - ids)} of {len(second)} unanswered {took:.0f} s after the restart:"
            f"\n{logs[1].read_text()[-3000:]}"
        )

        engines[0].send_signal(signal.SIGTERM)
        assert engines[0].wait(STOPS_S) == 0, logs[0].read_text()[-3000:]
        stopped_at = time.monotonic()
        third = send_relqueries(default_broker, topics, 2, every_partition=True)
        ids, _ = answered(default_broker, topics, SERVES_AGAIN_S, third)
        took = time.monotonic() - stopped_at
        assert third <= ids and took < SERVES_AGAIN_S, (
            f"{len(third - ids)} of {len(third)} unanswered {took:.0f} s after the other "
            f"engine stopped:\n{logs[1].read_text()[-3000:]}"
        )
        assert restarted.poll() is None
    finally:
        stop(processes)


def wait_for_line(log: Path, text: str, seconds: float, process: subprocess.Popen) -> str:
    deadline = time.monotonic() + seconds
    while text not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"no {text!r} within {seconds:g} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return log.read_text(errors="replace")


def ends_on_sigterm(process: subprocess.Popen, log: Path) -> float:
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOPS_S)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"still running {STOPS_S} s after SIGTERM:\n{log.read_text()[-3000:]}")
    return time.monotonic() - signalled


@pytest.mark.slow
def test_an_engine_and_a_worker_behind_a_killed_member_of_another_id_join_and_end_on_sigterm(
    default_broker, topics, tmp_path, monkeypatch
):
    # A member killed under another instance id (another host's, say) holds its
    # partitions until Kafka expires its session (the engine's 10 s, the worker's 6 s);
    # the next member waits that long at most, serves, and ends cleanly on SIGTERM. (The
    # broker relstream ran before never expired it: they waited for good.)
    group, app_id = f"e-{uuid.uuid4().hex[:6]}", f"w-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "queries.toml"
    config.write_text(QUERY)
    logs = {name: tmp_path / f"{name}.log" for name in ("ghost-e", "ghost-w", "engine", "worker")}
    processes: list[subprocess.Popen] = []
    try:
        monkeypatch.setenv("RELSTREAM_INSTANCE_ID", "ghost")
        processes.append(engine(default_broker, topics, group, logs["ghost-e"], tmp_path / "g"))
        ready = tmp_path / "gw"
        processes.append(
            start_worker(default_broker, topics, config, logs["ghost-w"], app_id, ready)
        )
        started(processes[-1], ready, logs["ghost-w"])
        for process in processes:
            kill(process)
        monkeypatch.delenv("RELSTREAM_INSTANCE_ID")
        readies = [tmp_path / "e.ready", tmp_path / "w.ready"]
        waiting = [
            engine_process(default_broker, topics, group, logs["engine"], ready_file=readies[0]),
            start_worker(default_broker, topics, config, logs["worker"], app_id, readies[1]),
        ]
        processes += waiting
        for process, ready_file, name in zip(waiting, readies, ["engine", "worker"], strict=True):
            started(process, ready_file, logs[name])
        took = [
            ends_on_sigterm(process, logs[name])
            for process, name in zip(waiting, ["engine", "worker"], strict=True)
        ]
        assert max(took) < STOPS_S
        for name in ("engine", "worker"):
            assert "Traceback" not in logs[name].read_text(errors="replace"), logs[name].read_text()
    finally:
        stop(processes)


def test_a_slot_is_the_lowest_free_one_per_broker_and_group_and_freed_by_its_holder(
    tmp_path, monkeypatch
):
    import socket

    from relstream.kafka.membership.static import member_slot

    monkeypatch.delenv("RELSTREAM_INSTANCE_ID", raising=False)
    host = socket.gethostname()
    first = member_slot("b:1", "g", folder=tmp_path)
    second = member_slot("b:1", "g", folder=tmp_path)
    elsewhere = member_slot("b:2", "g", folder=tmp_path)  # another broker's group
    other = member_slot("b:1", "h", folder=tmp_path)
    assert [first.instance_id, second.instance_id] == [f"{host}-0", f"{host}-1"]
    assert elsewhere.instance_id == other.instance_id == f"{host}-0"
    first.release()  # as the kernel does when its process dies
    assert member_slot("b:1", "g", folder=tmp_path).instance_id == f"{host}-0"
    assert member_slot("b:1", "g", folder=tmp_path).instance_id == f"{host}-2"
    assert member_slot("b:1", "g", explicit="mine", folder=tmp_path).instance_id == "mine"
    monkeypatch.setenv("RELSTREAM_INSTANCE_ID", "from-env")
    assert member_slot("b:1", "g", folder=tmp_path).instance_id == "from-env"
    assert member_slot("b:1", "g", "tansu", folder=tmp_path).instance_id is None
