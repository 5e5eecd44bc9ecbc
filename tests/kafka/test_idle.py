"""Idle consumers idle on Apache Kafka (`relstream broker`), which holds an empty fetch up
to the consumer's `fetch_max_wait_ms` (long polling); a record written after a long idle
spell still arrives at once. (The broker relstream ran before answered empty fetches at
once, and its idle consumers spun: ~80 % of a core, docs/benchmarks/idle.)

CPU is counted as process CPU time, not wall time, so a busy machine does not charge other
processes' work here. The bound, 5 % of a core (the issue's goal for the walkthrough's
processes), is >10x what an idle process here uses (0.4 %) and below what the old loop took
even on this 2-core machine under a load average of 14 (16 % and 31 %)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import stream_bin

from relstream import launch
from relstream.kafka.clients.aio import new_consumer, new_producer, running
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics

IDLE_S = 5.0  # the idle spell measured
MAX_CORE_SHARE = 0.05  # of one core, over the spell
PROMPT_S = 1.0  # a record written after the spell is read within this
QUERY = (
    '[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "Rate: {review}"\n'
    "window_seconds = 2.0\nmax_rows = 100\nmax_output_tokens = 4\n"
)


def cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU time of a process and its live children."""
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


def settle(process: psutil.Process, within_s: float = 60.0, window_s: float = 1.0) -> None:
    """Until `process` has used under `MAX_CORE_SHARE` of a core over a `window_s`
    window (the work of its start done, however long it takes), `within_s` at most: the
    spell measured after it judges either way."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        used, started = cpu_seconds(process), time.monotonic()
        time.sleep(window_s)
        if (cpu_seconds(process) - used) / (time.monotonic() - started) < MAX_CORE_SHARE:
            return


async def idle_then_one_record(bootstrap: str, topic: str, broker: psutil.Process):
    """A consumer group member on an empty topic: this process's share of a core over
    `IDLE_S`, the broker's meanwhile, then the seconds a record written takes to reach it."""
    consumer = new_consumer(bootstrap, topic, group_id=f"idle-{uuid.uuid4().hex[:8]}")
    producer = new_producer(bootstrap)
    async with running(producer, consumer):
        deadline = time.monotonic() + 30
        while not consumer.assignment():  # joined its group
            assert time.monotonic() < deadline, "the consumer was never assigned"
            await consumer.getmany(timeout_ms=200)
        # the join's work done at the broker (a JVM also compiles for its first minute)
        await asyncio.to_thread(settle, broker)
        own, theirs, started = time.process_time(), cpu_seconds(broker), time.monotonic()
        while time.monotonic() - started < IDLE_S:
            assert not await consumer.getmany(timeout_ms=500)
        spell = time.monotonic() - started
        shares = ((time.process_time() - own) / spell, (cpu_seconds(broker) - theirs) / spell)
        sent = time.monotonic()
        await producer.send_and_wait(topic, b"after the idle spell")
        while not await consumer.getmany(timeout_ms=100):
            assert time.monotonic() - sent < 30, "the record never arrived"
        return *shares, time.monotonic() - sent


@pytest.mark.slow
def test_an_idle_consumer_idles_on_the_default_broker_and_still_reads_at_once(default_broker):
    topic = f"idle-{uuid.uuid4().hex[:8]}"
    asyncio.run(create_topics(default_broker.bootstrap, {topic: 2}))
    broker = psutil.Process(default_broker.pid)
    own, theirs, latency = asyncio.run(
        idle_then_one_record(default_broker.bootstrap, topic, broker)
    )
    assert own < MAX_CORE_SHARE, f"an idle consumer took {own:.0%} of a core"
    assert theirs < MAX_CORE_SHARE, f"the broker took {theirs:.0%} of a core for it"
    assert latency < PROMPT_S, f"the record written after the idle spell took {latency:.2f} s"


@pytest.mark.slow
def test_an_idle_worker_idles_on_the_default_broker(default_broker, tmp_path: Path):
    """Faust's own consumer included: the worker's stages read through relstream's."""
    topics = Topics(prefix=f"idle{uuid.uuid4().hex[:6]}.")
    asyncio.run(create_topics(default_broker.bootstrap, topics.layout(("reviews",))))
    config = tmp_path / "queries.toml"
    config.write_text(QUERY)
    ready = tmp_path / "worker.ready"
    worker = launch.start_worker(
        [str(stream_bin() / "relstream")],
        default_broker,
        config,
        tmp_path / "worker.log",
        topics,
        ready_file=ready,
    )
    try:
        launch.wait_ready([ready], [worker], 120)
        process = psutil.Process(worker.pid)
        settle(process)  # past its start
        used, started = cpu_seconds(process), time.monotonic()
        time.sleep(IDLE_S)
        share = (cpu_seconds(process) - used) / (time.monotonic() - started)
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()
        assert share < MAX_CORE_SHARE, f"an idle worker took {share:.0%} of a core"
    finally:
        worker.send_signal(signal.SIGINT)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()


def test_the_idle_bench_counts_processes_born_and_ended_during_the_spell():
    from relstream_lab.idle.run import spent

    # pid 1 ran on (+0.5 s), pid 2 ended (nothing after the first reading), pid 3 was born
    assert spent({1: 1.0, 2: 2.0}, {1: 1.5, 3: 0.25}) == 0.75
