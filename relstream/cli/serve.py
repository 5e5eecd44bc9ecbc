"""`relstream broker | engine | worker`: the long-running processes of the streaming path."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import click

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    console,
    policy_option,
    prefix_option,
    security_options,
)
from relstream.engine.cpu import reexec_with_tcmalloc
from relstream.kafka.brokers import BROKERS, DEFAULT_BROKER
from relstream.kafka.security import KafkaSecurity
from relstream.service.backlog import DEFAULT_MAX_BACKLOG_ROWS


@click.command()
@click.option(
    "--kind",
    type=click.Choice(BROKERS),
    default=DEFAULT_BROKER,
    show_default=True,
    help="tansu keeps topics in memory; noida-db persists them under --data-dir.",
)
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@prefix_option
@click.option("--table", "tables", multiple=True, help="Also create the rows topic of TABLE.")
def broker(
    kind: str, port: int, data_dir: Path | None, prefix: str, tables: tuple[str, ...]
) -> None:
    """Run an embedded Kafka-protocol broker on 127.0.0.1 until Ctrl-C."""
    from relstream.kafka.brokers import EmbeddedBroker
    from relstream.kafka.topics import Topics

    # Blocked before the broker starts, so SIGTERM reaches sigwait below instead of
    # killing this process and orphaning the broker it started.
    stopping = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
    embedded = EmbeddedBroker(kind, port, data_dir, Topics(prefix), tables)
    bootstrap = embedded.start()
    console.print(f"{kind} ready: [bold]{bootstrap}[/] (topics under {prefix!r} created)")
    try:
        signal.sigwait(stopping)
    finally:
        embedded.stop()
        console.print(f"{kind} stopped")


@click.command()
@bootstrap_option
@click.option("--backend", type=click.Choice(["vllm", "sim"]), default="vllm", show_default=True)
@click.option(
    "--model",
    default="smollm2",
    show_default=True,
    help="vllm: smollm2, a local Hugging Face folder, or a Hub id (organisation/model).",
)
@click.option(
    "--max-model-len",
    default=2048,
    show_default=True,
    type=click.IntRange(16),
    help="vllm: the longest prompt plus answer, in tokens.",
)
@click.option(
    "--gpu-memory-utilization",
    default=None,
    type=click.FloatRange(0.05, 1.0),
    help="vllm on a GPU: the share of its memory for weights and KV [vLLM's 0.9].",
)
@click.option(
    "--tensor-parallel-size",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="vllm on GPUs: how many the model is split over.",
)
@policy_option
@click.option("--group", default="relstream-engine", show_default=True, help="Consumer group.")
@prefix_option
@broker_kind_option
@click.option(
    "--max-backlog-rows",
    default=DEFAULT_MAX_BACKLOG_ROWS,
    show_default=True,
    type=click.IntRange(1),
    help="Cap on rows handed to the engine at once (the budget is also sized from its KV).",
)
@click.option(
    "--max-attempts",
    default=3,
    show_default=True,
    type=click.IntRange(1),
    help="Tries of a relQuery whose serving fails before it is dead-lettered.",
)
@click.option("--partial-results", is_flag=True, help="Also publish each row as it finishes.")
@click.option("--metrics-port", default=None, type=click.IntRange(1, 65535))
@click.option("--metrics-host", default="127.0.0.1", show_default=True)
@click.option(
    "--sim-time-scale",
    default=0.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="sim: spend this fraction of each simulated latency in real time.",
)
@security_options
def engine(**opts) -> None:
    """Serve the relqueries topic and publish results (at-least-once). Exits non-zero if
    the engine fails; what it was serving is answered after a restart."""
    from relstream.backend import EngineFailure

    if opts["backend"] == "vllm":
        reexec_with_tcmalloc()
    try:
        asyncio.run(_serve_engine(opts))
    except EngineFailure as exc:
        raise click.ClickException(
            f"engine failed: {exc}. Nothing was committed past the relQueries it was "
            "serving; a restarted engine answers them."
        ) from None


async def _start_backend(opts: dict):
    if opts["backend"] == "sim":
        from relstream.sim.backend import SimRelQueryBackend, SimSettings

        return SimRelQueryBackend(
            SimSettings(policy=opts["policy"], time_scale=opts["sim_time_scale"])
        )
    from relstream.engine.runtime import EngineSettings, RelQueryEngine

    settings = EngineSettings(
        model=opts["model"],
        policy=opts["policy"],
        max_model_len=opts["max_model_len"],
        gpu_memory_utilization=opts["gpu_memory_utilization"],
        tensor_parallel_size=opts["tensor_parallel_size"],
    )
    return await RelQueryEngine.start(settings)


async def _serve_engine(opts: dict) -> None:
    from relstream.kafka.topics import Topics
    from relstream.service.service import EngineService, ServiceConfig

    backend = await _start_backend(opts)
    config = ServiceConfig(
        bootstrap=opts["bootstrap"],
        topics=Topics(opts["prefix"]),
        group_id=opts["group"],
        broker=opts["broker_kind"],
        max_backlog_rows=opts["max_backlog_rows"],
        max_attempts=opts["max_attempts"],
        partial_results=opts["partial_results"],
        metrics_port=opts["metrics_port"],
        metrics_host=opts["metrics_host"],
        security=opts["security"],
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    console.print(
        f"engine ({opts['backend']}, {opts['policy']}) serving {config.topics.relqueries}"
    )
    try:
        await EngineService(config, backend).run(stop)
    finally:
        backend.shutdown()


@click.command()
@bootstrap_option
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file of [[query]] registrations.",
)
@prefix_option
@broker_kind_option
@click.option("--app-id", default="relstream-worker", show_default=True)
@security_options
def worker(
    config_path: Path,
    bootstrap: str,
    prefix: str,
    broker_kind: str | None,
    app_id: str,
    security: KafkaSecurity,
) -> None:
    """Run the Faust worker: windows of rows become relQueries (needs relstream[stream])."""
    from relstream.kafka.clients import create_topics
    from relstream.kafka.topics import Topics
    from relstream.stream.registrations import RegistrationError, load_registrations

    try:
        registrations = load_registrations(config_path)
    except RegistrationError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        from faust.worker import Worker

        from relstream.stream.app import build_app
    except ImportError:
        raise click.ClickException(
            "the worker needs faust-streaming: pip install 'relstream[stream]' "
            "(in its own environment; see the README)"
        ) from None
    topics = Topics(prefix)
    tables = tuple({r.table for r in registrations})
    asyncio.run(create_topics(bootstrap, topics.layout(tables), security))
    app = build_app(bootstrap, registrations, topics, app_id, broker_kind, security)
    Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()
