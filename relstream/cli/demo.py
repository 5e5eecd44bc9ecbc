"""`relstream demo`: the whole path on one machine, with live progress.

broker (embedded) → the bundled sample table produced to its rows topic → Faust worker
(windows → relQueries) → engine service (vLLM CPU + SmolLM2, or the simulator) → results
topic, printed as they arrive; then everything is shut down.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from relstream.cli.common import broker_choice, console, policy_option, progress
from relstream.connectors.sources import read_rows
from relstream.extras import require
from relstream.kafka.clients.aio import Subscription, produce
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import DEFAULT_BROKER, EmbeddedBroker
from relstream.launch import (
    check_alive,
    relstream_command,
    spawn_logged,
    start_worker,
    stop_all,
    wait_ready,
)
from relstream.scheduler import DEFAULT_POLICY
from relstream.wire import ResultMessage, RowMessage, encode
from relstream.wire.formats import decode_record

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "sample_reviews.csv"
QUERIES = """\
[[query]]
name = "defects"
table = "reviews"
template = "Does this review report a product defect? Answer Yes or No.\\nReview: {review}"
choices = ["Yes", "No"]
window_seconds = 2.0
max_rows = 8
max_output_tokens = 4

[[query]]
name = "summary"
table = "reviews"
template = "Summarise this review of {product} in at most ten words.\\nReview: {review}"
window_seconds = 2.0
max_rows = 16
max_output_tokens = 24
"""


@dataclass(frozen=True)
class DemoOptions:
    backend: str = "vllm"
    policy: str = DEFAULT_POLICY
    broker: str = DEFAULT_BROKER
    timeout: float = 600.0
    keep_logs: bool = False  # the worker's and engine's logs kept (they are on a failure)


# What the results table's latency columns mean (docs/architecture: the paper's §2.1).
COLUMNS = (
    "seconds: queued, sent until the engine took it from Kafka; waiting, until its first "
    "row's prefill; core, until its last prefill ended; tail, until its last answer "
    "ended; total, their sum"
)


def _show_queries(console: Console) -> None:
    """Each query's question, once, as the worker asks it of every row."""
    from relstream.stream.registrations import load_registrations

    with tempfile.NamedTemporaryFile("w", suffix=".toml") as file:
        file.write(QUERIES)
        file.flush()
        registrations = load_registrations(Path(file.name))
    for registration in registrations:
        text = registration.template.text.replace("\n", " ")
        answers = ""
        if registration.output is not None and registration.output.choices:
            answers = f" (answers: {' or '.join(registration.output.choices)})"
        said = f"query {registration.name} asks of each row: {text}{answers}"
        console.print(said, highlight=False, markup=False, soft_wrap=True)


def run_demo(options: DemoOptions, console: Console) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="relstream-demo-"))
    done = False
    broker = EmbeddedBroker(options.broker, data_dir=workdir / "broker", tables=("reviews",))
    processes: list[subprocess.Popen] = []
    try:
        with console.status(f"starting {options.broker}"):
            broker.start()
        console.print(f"broker {options.broker} on [bold]{broker.bootstrap}[/]")
        config = workdir / "queries.toml"
        config.write_text(QUERIES)
        common = ["--bootstrap", broker.bootstrap, "--broker-kind", options.broker]
        processes.append(
            start_worker(
                relstream_command(True),
                broker,
                config,
                workdir / "worker.log",
                ready_file=workdir / "worker.ready",
            )
        )
        processes.append(
            spawn_logged(
                [
                    *relstream_command(False),
                    "engine",
                    "--backend",
                    options.backend,
                    "--policy",
                    options.policy,
                    *common,
                    "--ready-file",
                    str(workdir / "engine.ready"),
                ],
                workdir / "engine.log",
            )
        )
        console.print(f"worker and engine ({options.backend}, {options.policy}) starting")
        with console.status("waiting for the worker and the engine (the model loads first)"):
            started = time.monotonic()
            ready_files = [workdir / "worker.ready", workdir / "engine.ready"]
            wait_ready(ready_files, processes, options.timeout)
        console.print(f"worker and engine ready after {time.monotonic() - started:.1f} s")
        rows = list(read_rows(SAMPLE, "reviews", "review_id"))
        _show_queries(console)
        results = asyncio.run(_produce_and_follow(broker, rows, options, console, processes))
        _print_results(console, results)
        done = bool(results)
        return 0 if done else 1
    finally:
        stop_all(processes)
        broker.stop()
        shutil.rmtree(workdir / "broker", ignore_errors=True)
        if done and not options.keep_logs:
            shutil.rmtree(workdir, ignore_errors=True)
            console.print("stopped worker, engine and broker")
        else:
            console.print(f"stopped worker, engine and broker; their logs are in {workdir}")


async def _produce_and_follow(
    broker: EmbeddedBroker,
    rows: list[RowMessage],
    options: DemoOptions,
    console: Console,
    processes: list[subprocess.Popen],
) -> list[ResultMessage]:
    topics = Topics()
    messages = ((row.key.encode(), encode(row)) for row in rows)
    await produce(broker.bootstrap, topics.rows("reviews"), messages)
    expected = 2 * len(rows)  # two registrations read every row
    results: list[ResultMessage] = []
    subscription = Subscription(
        broker.bootstrap,
        topics.results,
        broker_kind=options.broker,
        timeout=options.timeout,
        on_poll=lambda: check_alive(processes),
    )
    with progress() as bar:
        task = bar.add_task(f"rows answered ({len(rows)} rows × 2 queries)", total=expected)
        async with subscription as answers:
            async for message in answers:
                result = decode_record(ResultMessage, message.value, message.headers)
                results.append(result)
                bar.advance(task, len(result.rows))
                total = result.latency.total if result.latency else 0.0
                bar.console.print(f"  {result.id}: {len(result.rows)} rows in {total:.2f} s")
                if bar.tasks[0].completed >= expected:
                    break
    return results


def _print_results(console: Console, results: list[ResultMessage]) -> None:
    table = Table(title="relQueries answered", caption=COLUMNS)
    components = ("queued", "waiting", "core", "tail", "total")
    for column in ("relQuery", "rows", *components, "first output"):
        table.add_column(
            column, justify="left" if column in ("relQuery", "first output") else "right"
        )
    for result in results:
        first = result.rows[0] if result.rows else None
        output = (first.output or first.error or "") if first else ""
        table.add_row(
            result.id,
            str(len(result.rows)),
            *(
                f"{getattr(result.latency, part) if result.latency else 0.0:.2f}"
                for part in components
            ),
            output.replace("\n", " ")[:48],
        )
    console.print(table)


@click.command()
@click.option(
    "--backend",
    type=click.Choice(["vllm", "sim"]),
    default="vllm",
    show_default=True,
    help="sim answers instantly by echoing each row's prompt.",
)
@policy_option
@broker_choice(DEFAULT_BROKER, "The broker: Apache Kafka, or tansu (memory only).")
@click.option("--timeout", default=900.0, show_default=True, help="Seconds to wait for results.")
@click.option(
    "--keep-logs", is_flag=True,
    help="Keep the worker's and engine's logs (a temporary folder, named at the end); "
    "they are kept anyway when the demo fails.",
)  # fmt: skip
def demo(backend: str, policy: str, broker_kind: str, timeout: float, keep_logs: bool) -> None:
    """Broker, worker and engine on the bundled sample table, answered live."""
    if broker_kind == "tansu":
        require("broker")
    try:
        code = run_demo(DemoOptions(backend, policy, broker_kind, timeout, keep_logs), console)
    except (RuntimeError, TimeoutError) as exc:
        raise click.ClickException(str(exc) or "timed out waiting for results") from None
    raise SystemExit(code)
