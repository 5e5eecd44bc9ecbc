"""`relstream broker | engine | worker | produce | results`: the streaming path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from relstream.cli import _progress, _reexec_with_tcmalloc, console, main
from relstream.scheduler import POLICIES


@main.command()
@click.option(
    "--kind", type=click.Choice(["noida-db", "tansu"]), default="noida-db", show_default=True
)
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--prefix", default="relstream.", show_default=True, help="Topic name prefix.")
@click.option("--table", "tables", multiple=True, help="Also create the rows topic of TABLE.")
def broker(
    kind: str, port: int, data_dir: Path | None, prefix: str, tables: tuple[str, ...]
) -> None:
    """Run an embedded Kafka-protocol broker on 127.0.0.1 until Ctrl-C."""
    import signal

    from relstream.broker import EmbeddedBroker, Topics

    embedded = EmbeddedBroker(kind, port, data_dir, Topics(prefix), tables)
    bootstrap = embedded.start()
    console.print(f"{kind} ready: [bold]{bootstrap}[/] (topics under {prefix!r} created)")
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        embedded.stop()
        console.print(f"{kind} stopped")


@main.command()
@click.option("--bootstrap", required=True, help="Kafka bootstrap address, host:port.")
@click.option("--backend", type=click.Choice(["vllm", "sim"]), default="vllm", show_default=True)
@click.option("--model", default="smollm2", show_default=True, help="Name or local HF folder.")
@click.option("--policy", type=click.Choice(list(POLICIES)), default="relserve", show_default=True)
@click.option("--group", default="relstream-engine", show_default=True, help="Consumer group.")
@click.option("--prefix", default="relstream.", show_default=True, help="Topic name prefix.")
@click.option(
    "--broker-kind",
    type=click.Choice(["noida-db", "tansu"]),
    default=None,
    help="The embedded broker in use, for its client settings.",
)
@click.option("--max-in-flight", default=8, show_default=True, type=click.IntRange(1))
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
def engine(**opts) -> None:
    """Serve the relqueries topic and publish results (at-least-once)."""
    if opts["backend"] == "vllm":
        _reexec_with_tcmalloc()
    asyncio.run(_serve_engine(opts))


async def _serve_engine(opts: dict) -> None:
    import signal

    from relstream.broker import Topics
    from relstream.engine.service import EngineService, ServiceConfig

    if opts["backend"] == "sim":
        from relstream.engine.simbackend import SimRelQueryBackend, SimSettings

        backend = SimRelQueryBackend(
            SimSettings(policy=opts["policy"], time_scale=opts["sim_time_scale"])
        )
    else:
        from relstream.engine.runtime import EngineSettings, RelQueryEngine

        backend = await RelQueryEngine.start(
            EngineSettings(model=opts["model"], policy=opts["policy"])
        )
    config = ServiceConfig(
        bootstrap=opts["bootstrap"],
        topics=Topics(opts["prefix"]),
        group_id=opts["group"],
        broker=opts["broker_kind"],
        max_in_flight=opts["max_in_flight"],
        partial_results=opts["partial_results"],
        metrics_port=opts["metrics_port"],
        metrics_host=opts["metrics_host"],
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


@main.command()
@click.option("--bootstrap", required=True, help="Kafka bootstrap address, host:port.")
@click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file of [[query]] registrations.",
)
@click.option("--prefix", default="relstream.", show_default=True, help="Topic name prefix.")
@click.option("--broker-kind", type=click.Choice(["noida-db", "tansu"]), default=None)
@click.option("--app-id", default="relstream-worker", show_default=True)
def worker(
    config_path: Path, bootstrap: str, prefix: str, broker_kind: str | None, app_id: str
) -> None:
    """Run the Faust worker: windows of rows become relQueries (needs relstream[stream])."""
    from relstream.broker import Topics, create_topics
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
    asyncio.run(create_topics(bootstrap, topics.layout(tables), broker_kind))
    app = build_app(bootstrap, registrations, topics, app_id, broker_kind)
    Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


@main.command()
@click.argument("source")
@click.option("--bootstrap", required=True, help="Kafka bootstrap address, host:port.")
@click.option("--table", required=True, help="Table name: rows go to <prefix>rows.<table>.")
@click.option("--key-column", default=None, help="Column holding each row's key.")
@click.option("--query", default=None, help="SQL to run when SOURCE is a postgresql:// URL.")
@click.option("--prefix", default="relstream.", show_default=True, help="Topic name prefix.")
def produce(
    source: str, bootstrap: str, table: str, key_column: str | None, query: str | None, prefix: str
) -> None:
    """Produce rows to the table's rows topic: SOURCE is a CSV, JSONL or Parquet file, or
    a postgresql:// URL with --query."""
    from relstream.connectors.sources import read_query, read_rows

    try:
        if source.startswith(("postgresql://", "postgres://")):
            if not query:
                raise click.UsageError("a postgresql:// source needs --query")
            rows = list(read_query(source, query, table, key_column))
        else:
            path = Path(source)
            if not path.is_file():
                raise click.BadParameter(f"{source}: no such file", param_hint="SOURCE")
            rows = list(read_rows(path, table, key_column))
    except (ValueError, KeyError) as exc:
        raise click.ClickException(f"{source}: {exc}") from None
    asyncio.run(_produce_rows(bootstrap, prefix, table, rows))


async def _produce_rows(bootstrap: str, prefix: str, table: str, rows: list[dict]) -> None:
    from aiokafka import AIOKafkaProducer

    from relstream.broker import Topics, create_topics
    from relstream.schemas import MessageError, encode

    topics = Topics(prefix)
    await create_topics(bootstrap, topics.layout((table,)))
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        with _progress() as progress:
            task = progress.add_task(f"producing to {topics.rows(table)}", total=len(rows))
            for row in rows:
                try:
                    value = encode("row", row)
                except MessageError as exc:
                    raise click.ClickException(f"row {row['key']!r}: {exc.reason}") from None
                await producer.send(topics.rows(table), value, key=row["key"].encode())
                progress.advance(task)
            await producer.flush()
    finally:
        await producer.stop()
    console.print(f"produced {len(rows)} rows to {topics.rows(table)}")


@main.command()
@click.option("--bootstrap", required=True, help="Kafka bootstrap address, host:port.")
@click.option("--prefix", default="relstream.", show_default=True, help="Topic name prefix.")
@click.option("--follow", is_flag=True, help="Keep waiting for new results.")
@click.option("--broker-kind", type=click.Choice(["noida-db", "tansu"]), default=None)
def results(bootstrap: str, prefix: str, follow: bool, broker_kind: str | None) -> None:
    """Print results from the results topic (from the beginning)."""
    asyncio.run(_tail_results(bootstrap, prefix, follow, broker_kind))


async def _tail_results(bootstrap: str, prefix: str, follow: bool, broker_kind: str | None) -> None:
    import uuid

    group = f"relstream-results-{uuid.uuid4().hex[:8]}"
    await _for_each_result(bootstrap, prefix, group, follow, broker_kind, _print_result)


async def _for_each_result(bootstrap, prefix, group, follow, broker_kind, handle) -> int:
    """Call `handle(result)` for each result from the start of the results topic; commit
    the group's offsets once a batch is handled. Stops after 3 idle seconds unless
    following. Returns how many calls returned a true value."""
    from aiokafka import AIOKafkaConsumer

    from relstream.broker import Topics, client_settings
    from relstream.schemas import MessageError, decode

    consumer = AIOKafkaConsumer(
        Topics(prefix).results,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **client_settings(broker_kind),
    )
    await consumer.start()
    counted = idle = 0
    try:
        while follow or idle < 3:
            batches = await consumer.getmany(timeout_ms=1000)
            idle = 0 if batches else idle + 1
            for messages in batches.values():
                for message in messages:
                    try:
                        counted += bool(handle(decode("result", message.value)))
                    except MessageError as exc:
                        console.print(
                            f"[red]skipped unreadable result at offset {message.offset}: {exc}[/]"
                        )
            if batches:
                await consumer.commit()
    finally:
        await consumer.stop()
    return counted


def _print_result(result: dict) -> None:
    latency = result["latency"] or {}
    parts = " ".join(
        f"{k} {latency[k]:.2f}s" for k in ("waiting", "core", "tail", "total") if k in latency
    )
    console.print(
        f"[bold]{result['id']}[/] {len(result['rows'])} rows ({result['policy']}) {parts}"
    )
    for row in result["rows"][:3]:
        text = row["output"] if row["status"] == "ok" else f"[red]{row['error']}[/]"
        console.print(f"  {row['key']}: {text}")


@main.command()
@click.option(
    "--backend",
    type=click.Choice(["vllm", "sim"]),
    default="vllm",
    show_default=True,
    help="sim answers instantly by echoing each row's prompt.",
)
@click.option("--policy", type=click.Choice(list(POLICIES)), default="relserve", show_default=True)
@click.option(
    "--broker",
    "broker_kind",
    type=click.Choice(["noida-db", "tansu"]),
    default="tansu",
    show_default=True,
    help="tansu by default: idle noida-db consumers spin and starve the engine (README).",
)
@click.option("--timeout", default=900.0, show_default=True, help="Seconds to wait for results.")
def demo(backend: str, policy: str, broker_kind: str, timeout: float) -> None:
    """Broker, worker and engine on the bundled sample table, answered live."""
    from relstream.demo import DemoOptions, run_demo

    try:
        code = run_demo(DemoOptions(backend, policy, broker_kind, timeout), console)
    except (RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc) or "timed out waiting for results") from None
    raise SystemExit(code)


@main.command()
@click.argument("target")
@click.option("--bootstrap", required=True, help="Kafka bootstrap address, host:port.")
@click.option("--prefix", default="relstream.", show_default=True, help="Topic name prefix.")
@click.option("--group", default="relstream-sink", show_default=True, help="Consumer group.")
@click.option("--follow", is_flag=True, help="Keep consuming new results.")
@click.option("--broker-kind", type=click.Choice(["noida-db", "tansu"]), default=None)
def sink(
    target: str, bootstrap: str, prefix: str, group: str, follow: bool, broker_kind: str | None
) -> None:
    """Store results in TARGET: a .jsonl or .csv file, or a postgresql:// URL (idempotent
    on relQuery id)."""
    from relstream.connectors.sinks import open_sink

    try:
        store = open_sink(target)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
    try:
        written = asyncio.run(_drain_results(store, bootstrap, prefix, group, follow, broker_kind))
    finally:
        store.close()
    console.print(f"stored {written} new results in {target}")


async def _drain_results(store, bootstrap, prefix, group, follow, broker_kind) -> int:
    return await _for_each_result(bootstrap, prefix, group, follow, broker_kind, store.write)
