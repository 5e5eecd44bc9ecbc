"""`relstream-lab bench streaming`: what the streaming path costs.

1. Overhead, at each load: the same trace (arrival times from the paper-style
   generator, load as a fraction of the engine's capacity) submitted straight to the
   engine, then as ad-hoc relQueries through the relqueries topic and the engine service
   (Kafka both ways), then straight again, on one warmed engine. Latency through Kafka is
   produce → result consumed. During the Kafka run the backlog (relQueries produced and
   not yet answered) and the resident memory of the engine (this process and vLLM's core)
   are sampled.
2. Throughput of the window → relQuery stage: the worker started and warmed, then rows
   produced live, rows/s from the first row produced to the last relQuery
   (`window_throughput`).
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from relstream.kafka.clients.aio import Subscription, new_producer
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import BROKERS, DEFAULT_BROKER, EmbeddedBroker
from relstream.wire import RelQueryMessage, ResultMessage, RowMessage, decode, encode
from relstream.wire.convert import relquery_message
from relstream_lab.campaign.run import replay
from relstream_lab.common.workload import (
    TraceConfig,
    TraceEntry,
    generate_relqueries,
    load_datasets,
)
from relstream_lab.streaming.overhead import paired_overhead


@dataclass(frozen=True)
class StreamBenchOptions:
    model: str
    policy: str
    loads: tuple[float, ...]  # fractions of the engine's measured capacity
    trace: TraceConfig
    datasets_dir: Path | None
    throughput_rows: int
    out_dir: Path
    broker: str = DEFAULT_BROKER
    command: str = ""
    repeats: tuple[int, ...] = (2,)  # Kafka runs per load (one for all loads, or one each)

    def repeats_at(self, index: int) -> int:
        return self.repeats[index] if len(self.repeats) > 1 else self.repeats[0]


# How much the engine's resident memory (front end and core) may grow under overload
# over the engine at rest: the row budget, not the load, bounds what it holds.
RSS_GROWTH_CAP_MB = 512
SAMPLE_EVERY_S = 0.5


@dataclass
class KafkaRun:
    latencies: list[float]  # per relQuery: produced → result consumed
    in_engine: list[float] = field(default_factory=list)  # per relQuery: waiting+core+tail
    peak_backlog: int = 0  # relQueries produced and not yet answered, at most
    peak_rss: int = 0  # bytes, this process and its children, at most


async def through_kafka(engine, entries: Sequence[TraceEntry], rate: float, broker) -> KafkaRun:
    """Latency of each relQuery as a producer sees it: produce → its result consumed."""
    from relstream.service.service import KafkaService, ServiceConfig

    topics = Topics(prefix=f"b{uuid.uuid4().hex[:6]}.")
    await create_topics(broker.bootstrap, topics.layout())
    stop = asyncio.Event()
    config = ServiceConfig(
        broker.bootstrap,
        topics,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        broker=broker.kind,
    )
    service = asyncio.create_task(KafkaService(config, engine).run(stop))
    producer = new_producer(broker.bootstrap)
    await producer.start()
    sent_at: dict[str, float] = {}
    latencies: dict[str, float] = {}
    in_engine: dict[str, float] = {}
    run = KafkaRun([])

    async def read_results() -> None:
        subscription = Subscription(
            broker.bootstrap, topics.results, broker_kind=broker.kind, poll_ms=200
        )
        async with subscription as results:
            async for message in results:
                result = decode(ResultMessage, message.value)
                latencies.setdefault(result.id, time.monotonic() - sent_at[result.id])
                in_engine.setdefault(result.id, engine_latency(result))
                if len(latencies) == len(entries):
                    return

    async def sample() -> None:
        while True:
            run.peak_backlog = max(run.peak_backlog, len(sent_at) - len(latencies))
            run.peak_rss = max(run.peak_rss, process_tree_rss())
            await asyncio.sleep(SAMPLE_EVERY_S)

    reader = asyncio.create_task(read_results())
    sampler = asyncio.create_task(sample())
    started = time.monotonic()
    for entry in entries:
        delay = started + entry.relquery.arrival_time / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sent_at[entry.relquery.id] = time.monotonic()
        value = encode(relquery_message(entry.relquery))
        await producer.send_and_wait(topics.relqueries, value, key=entry.relquery.id.encode())
    await reader
    sampler.cancel()
    await producer.stop()
    stop.set()
    await service
    run.latencies = [latencies[entry.relquery.id] for entry in entries]
    run.in_engine = [in_engine[entry.relquery.id] for entry in entries]
    return run


def engine_latency(result: ResultMessage) -> float:
    """The engine's own part of a result's latency: from taking it to its last token."""
    if result.latency is None:
        return 0.0
    return result.latency.waiting + result.latency.core + result.latency.tail


def kafka_added_share(run: KafkaRun) -> float:
    """What the Kafka path adds inside one run (produce → taken, plus result published →
    consumed), over the engine's own latency: a comparison no run-to-run noise enters."""
    added = statistics.fmean(o - e for o, e in zip(run.latencies, run.in_engine, strict=True))
    return added / statistics.fmean(run.in_engine)


def process_tree_rss() -> int:
    """Resident bytes of this process and its children (vLLM's engine core)."""
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def broker_idle_cpu(kind: str, seconds: float = 10.0) -> float:
    """Share of one core an embedded broker burns while one consumer waits on an empty
    topic: why one broker is every command's default."""
    import psutil

    async def idle_consumer(broker) -> None:
        await create_topics(broker.bootstrap, {"idle": 1})
        subscription = Subscription(
            broker.bootstrap, "idle", broker_kind=broker.kind, idle_seconds=seconds + 5
        )
        async with subscription as messages:
            async for _ in messages:
                pass

    with tempfile.TemporaryDirectory() as data, EmbeddedBroker(kind, data_dir=Path(data)) as broker:
        process = psutil.Process(broker.pid)
        consumer = threading.Thread(target=asyncio.run, args=(idle_consumer(broker),))
        consumer.start()
        time.sleep(3)  # joined and polling
        before = sum(process.cpu_times()[:2])
        time.sleep(seconds)
        used = sum(process.cpu_times()[:2]) - before
        consumer.join()
    return used / seconds


THROUGHPUT_WINDOW_ROWS = 1000  # rows per window in the throughput test


def window_throughput(broker, rows: int, stream_command: list[str], workdir: Path) -> dict:
    """Rows/s through the Faust window → relQuery stage, fed live.

    The worker is started and warmed (one full window per partition answered), then
    `rows` rows are produced as fast as this process can, round-robin over the
    partitions so that every window closes by its row count, never by time. Rows/s runs
    from the first row produced to the broker timestamp of the relQuery that completes
    the count, so it counts the worker's fetching, decoding, windowing and producing,
    and is bounded by this process's producer where that is slower. `cpu_seconds`: what
    the worker process (all its threads) spent over the timed rows."""
    import psutil

    from relstream.launch import start_worker

    topics = Topics(prefix=f"w{uuid.uuid4().hex[:6]}.")
    window_rows = THROUGHPUT_WINDOW_ROWS * topics.partitions
    rows = max(window_rows, rows - rows % window_rows)
    config = workdir / "throughput.toml"
    config.write_text(
        '[[query]]\nname = "t"\ntable = "items"\ntemplate = "Rate {text}"\n'
        f"window_seconds = 1.0\nmax_rows = {THROUGHPUT_WINDOW_ROWS}\nmax_output_tokens = 4\n"
    )
    asyncio.run(create_topics(broker.bootstrap, topics.layout(("items",))))
    worker = start_worker(
        stream_command,
        broker,
        config,
        workdir / "throughput-worker.log",
        topics,
        f"tp-{uuid.uuid4().hex[:6]}",
    )
    process = psutil.Process(worker.pid)
    try:
        return asyncio.run(
            _time_stage(broker, topics, window_rows, rows, lambda: sum(process.cpu_times()[:2]))
        )
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()


async def _time_stage(
    broker, topics: Topics, warm_rows: int, rows: int, cpu: Callable[[], float]
) -> dict:
    subscription = Subscription(
        broker.bootstrap, topics.relqueries, broker_kind=broker.kind, timeout=600
    )
    async with subscription as relqueries:
        await asyncio.gather(
            _produce_items(broker, topics, range(warm_rows)),
            _last_relquery_stamp(relqueries, warm_rows),
        )
        spent = cpu()
        started = time.time()
        produced, last = await asyncio.gather(
            _produce_items(broker, topics, range(warm_rows, warm_rows + rows)),
            _last_relquery_stamp(relqueries, rows),
        )
        spent = cpu() - spent
    return {
        "rows": rows,
        "seconds": last - started,
        "rows_per_second": rows / (last - started),
        "producer_rows_per_second": rows / (produced - started),
        "cpu_seconds": spent,
    }


async def _produce_items(broker, topics: Topics, indices: range) -> float:
    """Produce rows `indices`, round-robin over the partitions; returns when the broker
    had them all (wall clock)."""
    producer = new_producer(broker.bootstrap, linger_ms=20)
    await producer.start()
    try:
        for index in indices:
            row = RowMessage(table="items", key=f"i{index}", values={"text": f"item {index}"})
            await producer.send(
                topics.rows("items"),
                encode(row),
                key=row.key.encode(),
                partition=index % topics.partitions,
            )
        await producer.flush()
    finally:
        await producer.stop()
    return time.time()


async def _last_relquery_stamp(relqueries, rows: int) -> float:
    """Broker timestamp (s) of the relQuery that brings the rows read to `rows`."""
    counted = 0
    async for message in relqueries:
        counted += len(decode(RelQueryMessage, message.value).rows)
        if counted >= rows:
            return message.timestamp / 1000
    raise RuntimeError(f"the worker produced relQueries for {counted} of {rows} rows")


def run_stream_benchmark(
    options: StreamBenchOptions,
    on_step: Callable[[str], None],
    on_load: Callable[[dict], None] = lambda document: None,
) -> dict:
    """The whole benchmark; `on_load` gets the document after each load, so an
    interrupted benchmark still leaves the loads it finished."""
    from relstream.engine.runtime import EngineSettings, VllmRuntime
    from relstream.launch import relstream_command

    entries = generate_relqueries(options.trace, load_datasets(options.datasets_dir))
    options.out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="relstream-streambench-"))  # logs, broker data
    with EmbeddedBroker(options.broker, data_dir=workdir / "broker") as broker:
        on_step(f"{options.broker} on {broker.bootstrap}; measuring window throughput")
        throughput = window_throughput(
            broker, options.throughput_rows, relstream_command(True), workdir
        )
        on_step(f"window → relQuery: {throughput['rows_per_second']:.0f} rows/s")
    idle_cpu = {kind: broker_idle_cpu(kind) for kind in BROKERS}
    on_step("idle broker CPU: " + ", ".join(f"{k} {v:.0%}" for k, v in idle_cpu.items()))
    document = {
        "command": options.command,
        "broker": options.broker,
        "model": options.model,
        "policy": options.policy,
        "relqueries": len(entries),
        "loads_planned": list(options.loads),
        "loads": [],
        "window_throughput": throughput,
        "broker_idle_cpu": idle_cpu,
    }
    with EmbeddedBroker(options.broker, data_dir=workdir / "broker-latency") as broker:

        async def latency_runs():
            engine = await VllmRuntime.start(
                EngineSettings(model=options.model, policy=options.policy)
            )
            try:
                await replay(engine, entries[:2], None)  # warm-up
                whole = await replay(engine, entries, None)
                capacity = len(entries) / (whole.window[1] - whole.window[0])
                at_rest = process_tree_rss() / 2**20
                document["capacity_relqueries_per_s"] = capacity
                document["rss_at_rest_mb"] = at_rest
                document["rss_cap_mb"] = at_rest + RSS_GROWTH_CAP_MB
                for index, load in enumerate(options.loads):
                    repeats = options.repeats_at(index)
                    run = await _at_load(engine, entries, load * capacity, broker, repeats, on_step)
                    document["loads"].append({"load": load, **run})
                    on_load(document)
            finally:
                engine.shutdown()

        asyncio.run(latency_runs())
    return document


async def _at_load(engine, entries, rate: float, broker, repeats: int, on_step) -> dict:
    """Straight to the engine, then `repeats` times through Kafka and straight again: the
    direct runs on both sides of every Kafka run bound run-to-run noise and drift."""
    direct: list[list[float]] = []  # per run, each relQuery's latency in trace order
    kafka: list[KafkaRun] = []
    for label in ("direct", *("kafka", "direct") * repeats):
        on_step(f"rate {rate:.4f} relQueries/s; {label}")
        await engine.reset_prefix_cache()
        if label == "kafka":
            kafka.append(await through_kafka(engine, entries, rate, broker))
        else:
            replayed = await replay(engine, entries, rate)
            direct.append([o.latency.total for o in replayed.outcomes])
    direct_means = [statistics.fmean(run) for run in direct]
    kafka_means = [statistics.fmean(run.latencies) for run in kafka]
    overhead = paired_overhead(direct_means, kafka_means)
    mean_direct, mean_kafka = statistics.fmean(direct_means), statistics.fmean(kafka_means)
    return {
        "rate_relqueries_per_s": rate,
        "mean_latency_direct_s": mean_direct,
        "mean_latency_direct_runs_s": direct_means,
        "direct_run_spread": (max(direct_means) - min(direct_means)) / mean_direct,
        "mean_latency_kafka_s": mean_kafka,
        "mean_latency_kafka_runs_s": kafka_means,
        "kafka_run_spread": (max(kafka_means) - min(kafka_means)) / mean_kafka,
        "kafka_overhead": overhead.mean,
        "kafka_overhead_paired": list(overhead.paired),
        "kafka_overhead_interval_95": (
            None if overhead.low is None else [overhead.low, overhead.high]
        ),
        "kafka_added_share_runs": [kafka_added_share(run) for run in kafka],
        "peak_backlog_relqueries": max(run.peak_backlog for run in kafka),
        "peak_rss_mb": max(run.peak_rss for run in kafka) / 2**20,
        "latencies_direct_s": direct,
        "latencies_kafka_s": [run.latencies for run in kafka],
        "latencies_kafka_in_engine_s": [run.in_engine for run in kafka],
    }
