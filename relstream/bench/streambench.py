"""`relstream bench --backend streaming`: what the streaming path costs.

1. Overhead: the same trace (arrival times from the paper-style generator, load as a
   fraction of the engine's capacity) submitted straight to the engine, then as ad-hoc
   relQueries through the relqueries topic and the engine service (Kafka both ways), on
   one warmed engine. Latency through Kafka is produce → result consumed.
2. Throughput of the window → relQuery stage: rows already on the rows topic, the Faust
   worker started, rows/s measured between the first and last relQuery it produced.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from relstream.bench.vllmbench import replay
from relstream.bench.workload import TraceConfig, TraceEntry, generate_relqueries, load_datasets
from relstream.kafka.brokers import DEFAULT_BROKER, EmbeddedBroker
from relstream.kafka.clients import Subscription, create_topics, new_producer, produce
from relstream.kafka.topics import Topics
from relstream.schemas import RelQueryMessage, ResultMessage, RowMessage, decode, encode
from relstream.schemas.convert import relquery_message


@dataclass(frozen=True)
class StreamBenchOptions:
    model: str
    policy: str
    load: float
    rate: float | None  # relQueries/s; None: measure capacity first
    trace: TraceConfig
    datasets_dir: Path | None
    throughput_rows: int
    out_dir: Path
    broker: str = DEFAULT_BROKER
    command: str = ""


async def through_kafka(engine, entries: Sequence[TraceEntry], rate: float, broker) -> list[float]:
    """Latency of each relQuery as a producer sees it: produce → its result consumed."""
    from relstream.service.service import EngineService, ServiceConfig

    topics = Topics(prefix=f"b{uuid.uuid4().hex[:6]}.")
    await create_topics(broker.bootstrap, topics.layout())
    stop = asyncio.Event()
    config = ServiceConfig(
        broker.bootstrap,
        topics,
        group_id=f"bench-{uuid.uuid4().hex[:6]}",
        broker=broker.kind,
    )
    service = asyncio.create_task(EngineService(config, engine).run(stop))
    producer = new_producer(broker.bootstrap)
    await producer.start()
    sent_at: dict[str, float] = {}
    latencies: dict[str, float] = {}

    async def read_results() -> None:
        subscription = Subscription(
            broker.bootstrap, topics.results, broker_kind=broker.kind, poll_ms=200
        )
        async with subscription as results:
            async for message in results:
                result_id = decode(ResultMessage, message.value).id
                latencies.setdefault(result_id, time.monotonic() - sent_at[result_id])
                if len(latencies) == len(entries):
                    return

    reader = asyncio.create_task(read_results())
    started = time.monotonic()
    for entry in entries:
        delay = started + entry.relquery.arrival_time / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        sent_at[entry.relquery.id] = time.monotonic()
        value = encode(relquery_message(entry.relquery))
        await producer.send_and_wait(topics.relqueries, value, key=entry.relquery.id.encode())
    await reader
    await producer.stop()
    stop.set()
    await service
    return list(latencies.values())


def window_throughput(broker, rows: int, stream_command: list[str], workdir: Path) -> dict:
    """Rows/s through the Faust window → relQuery stage, rows produced beforehand."""
    from relstream.stream.launch import start_worker

    topics = Topics(prefix=f"w{uuid.uuid4().hex[:6]}.")
    config = workdir / "throughput.toml"
    config.write_text(
        '[[query]]\nname = "t"\ntable = "items"\ntemplate = "Rate {text}"\n'
        "window_seconds = 1.0\nmax_rows = 1000\nmax_output_tokens = 4\n"
    )
    asyncio.run(_produce_items(broker, topics, rows))
    worker = start_worker(
        stream_command,
        broker,
        config,
        workdir / "throughput-worker.log",
        topics,
        f"tp-{uuid.uuid4().hex[:6]}",
    )
    try:
        first, last, counted = asyncio.run(_time_relqueries(broker, topics, rows))
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
    return {"rows": counted, "seconds": last - first, "rows_per_second": counted / (last - first)}


async def _produce_items(broker, topics: Topics, rows: int) -> None:
    await create_topics(broker.bootstrap, topics.layout(("items",)))
    items = (
        RowMessage(table="items", key=f"i{index}", values={"text": f"item {index}"})
        for index in range(rows)
    )
    messages = ((row.key.encode(), encode(row)) for row in items)
    await produce(broker.bootstrap, topics.rows("items"), messages, linger_ms=20)


async def _time_relqueries(broker, topics: Topics, rows: int) -> tuple[float, float, int]:
    """Broker timestamps of the first and last relQuery, and the rows they carried.

    The first relQuery's own rows are excluded: the clock starts when it was produced."""
    stamps: list[tuple[float, int]] = []
    subscription = Subscription(
        broker.bootstrap, topics.relqueries, broker_kind=broker.kind, timeout=600
    )
    async with subscription as relqueries:
        async for message in relqueries:
            count = len(decode(RelQueryMessage, message.value).rows)
            stamps.append((message.timestamp / 1000, count))
            if sum(n for _, n in stamps) >= rows:
                break
    stamps.sort()
    return stamps[0][0], stamps[-1][0], sum(n for _, n in stamps[1:])


def run_stream_benchmark(options: StreamBenchOptions, on_step: Callable[[str], None]) -> dict:
    from relstream.engine.runtime import EngineSettings, RelQueryEngine
    from relstream.stream.launch import relstream_command

    entries = generate_relqueries(options.trace, load_datasets(options.datasets_dir))
    options.out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="relstream-streambench-"))  # logs, broker data
    with EmbeddedBroker(options.broker, data_dir=workdir / "broker") as broker:
        on_step(f"{options.broker} on {broker.bootstrap}; measuring window throughput")
        throughput = window_throughput(
            broker, options.throughput_rows, relstream_command(True), workdir
        )
        on_step(f"window → relQuery: {throughput['rows_per_second']:.0f} rows/s")

        async def latency_runs():
            engine = await RelQueryEngine.start(
                EngineSettings(model=options.model, policy=options.policy)
            )
            try:
                await replay(engine, entries[:2], None)  # warm-up
                rate = options.rate
                if rate is None:
                    whole = await replay(engine, entries, None)
                    rate = options.load * len(entries) / (whole.window[1] - whole.window[0])
                # direct, Kafka, direct again: the two direct runs bound run-to-run noise
                runs = []
                for label in ("direct", "kafka", "direct again"):
                    on_step(f"rate {rate:.4f} relQueries/s; {label}")
                    await engine.reset_prefix_cache()
                    if label == "kafka":
                        runs.append(await through_kafka(engine, entries, rate, broker))
                    else:
                        replayed = await replay(engine, entries, rate)
                        runs.append([o.latency.total for o in replayed.outcomes])
                return rate, runs
            finally:
                engine.shutdown()

        rate, (direct, kafka, direct_again) = asyncio.run(latency_runs())
    mean_kafka = statistics.fmean(kafka)
    direct_means = [statistics.fmean(direct), statistics.fmean(direct_again)]
    mean_direct = statistics.fmean(direct_means)
    return {
        "command": options.command,
        "broker": options.broker,
        "model": options.model,
        "policy": options.policy,
        "rate_relqueries_per_s": rate,
        "relqueries": len(entries),
        "mean_latency_direct_s": mean_direct,
        "mean_latency_direct_runs_s": direct_means,
        "direct_run_spread": abs(direct_means[1] - direct_means[0]) / mean_direct,
        "mean_latency_kafka_s": mean_kafka,
        "kafka_overhead": mean_kafka / mean_direct - 1.0,
        "window_throughput": throughput,
    }


def write_stream_report(document: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from relstream.bench.report import machine_description, write_report

    document = {**document, "machine": machine_description()}
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    values = [document["mean_latency_direct_s"], document["mean_latency_kafka_s"]]
    ax.bar(["straight to the engine", "through Kafka"], values, color=["#4c72b0", "#dd8452"])
    ax.set_ylabel("mean relQuery latency (s)")
    ax.set_title(f"Kafka overhead: {document['kafka_overhead']:+.1%}")
    fig.tight_layout()
    fig.savefig(out / "overhead.png", dpi=120)
    plt.close(fig)
    throughput = document["window_throughput"]
    body = [
        "| measure | value | goal |",
        "|---|---|---|",
        f"| mean relQuery latency, straight to the engine (mean of 2 runs) | {values[0]:.2f} s | |",
        f"| spread between the two direct runs | {document['direct_run_spread']:.1%} | |",
        f"| mean relQuery latency, through Kafka | {values[1]:.2f} s | |",
        f"| overhead of Kafka + the engine service | {document['kafka_overhead']:+.1%} | < 5 % |",
        f"| window → relQuery rows/s (Faust worker) | {throughput['rows_per_second']:,.0f} | "
        "≥ 20,000 |",
        "",
        f"The same {document['relqueries']} relQueries at {document['rate_relqueries_per_s']:.4f} "
        "relQueries/s (Poisson), one warmed engine, prefix cache reset before each run, run "
        "straight, through Kafka, then straight again. "
        "Through Kafka, latency runs from producing the relquery message to consuming its "
        f"result. Throughput: {throughput['rows']:,} rows pre-produced, then timed between "
        "the first and last relQuery the worker produced (broker timestamps).",
        "",
        "![overhead](overhead.png)",
        "",
    ]
    setting = (
        f"Broker: embedded {document['broker']}; engine: vLLM CPU build, "
        f"{document['model']}, policy {document['policy']}."
    )
    write_report(out, "Streaming benchmark", document, setting, body)
