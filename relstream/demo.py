"""`relstream demo`: the whole path on one machine, with live progress.

broker (embedded) → `relstream produce` of the bundled sample table → Faust worker
(windows → relQueries) → engine service (vLLM CPU + SmolLM2, or the simulator) → results
topic, printed as they arrive; then everything is shut down.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from relstream.broker import EmbeddedBroker, Topics, client_settings
from relstream.connectors.sources import read_rows
from relstream.schemas import decode, encode

SAMPLE = Path(__file__).with_name("data") / "sample_reviews.csv"
QUERIES = """\
[[query]]
name = "defects"
table = "reviews"
template = "Does this review report a product defect? Answer Yes or No.\\nReview: {review}"
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
    policy: str = "relserve"
    # Tansu: noida-db's idle consumers spin (85 % of a core each), starving the engine.
    broker: str = "tansu"
    timeout: float = 600.0


def relstream_command(needs_faust: bool) -> list[str]:
    """How to run `relstream` for a role: the worker needs the Faust environment."""
    if needs_faust:
        stream_bin = os.environ.get("RELSTREAM_STREAM_BIN")
        candidates = [Path(stream_bin)] if stream_bin else []
        candidates.append(Path(__file__).resolve().parents[1] / ".venv-stream" / "bin")
        for folder in candidates:
            if (folder / "relstream").exists():
                return [str(folder / "relstream")]
    return [sys.executable, "-m", "relstream"]


def run_demo(options: DemoOptions, console: Console) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="relstream-demo-"))
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
            start_worker(relstream_command(True), broker, config, workdir / "worker.log")
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
                ],
                workdir / "engine.log",
            )
        )
        console.print(
            f"worker and engine ({options.backend}, {options.policy}) starting; logs in {workdir}"
        )
        rows = list(read_rows(SAMPLE, "reviews", "review_id"))
        results = asyncio.run(_produce_and_follow(broker, rows, options, console, processes))
        _print_results(console, results)
        return 0 if results else 1
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
        broker.stop()
        shutil.rmtree(workdir / "broker", ignore_errors=True)
        console.print("stopped worker, engine and broker")


def spawn_logged(command: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)


def start_worker(
    executable: list[str],
    broker: EmbeddedBroker,
    config: Path,
    log: Path,
    topics: Topics | None = None,
    app_id: str | None = None,
) -> subprocess.Popen:
    """The Faust worker as a subprocess (`executable` from `relstream_command(True)`)."""
    command = [
        *executable,
        "worker",
        "--bootstrap",
        broker.bootstrap,
        "--config",
        str(config),
        "--prefix",
        (topics or Topics()).prefix,
        "--broker-kind",
        broker.kind,
    ]
    if app_id:
        command += ["--app-id", app_id]
    return spawn_logged(command, log)


async def _produce_and_follow(broker, rows, options, console, processes) -> list[dict]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    topics = Topics()
    producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap)
    await producer.start()
    for row in rows:
        await producer.send(topics.rows("reviews"), encode("row", row), key=row["key"].encode())
    await producer.stop()
    expected = 2 * len(rows)  # two registrations read every row
    consumer = AIOKafkaConsumer(
        topics.results,
        bootstrap_servers=broker.bootstrap,
        group_id=f"demo-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
        **client_settings(options.broker),
    )
    await consumer.start()
    results: list[dict] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=console) as progress:
            task = progress.add_task(
                f"rows answered ({len(rows)} rows × 2 queries)", total=expected
            )
            async with asyncio.timeout(options.timeout):
                while progress.tasks[0].completed < expected:
                    _check_alive(processes)
                    for messages in (await consumer.getmany(timeout_ms=500)).values():
                        for message in messages:
                            result = decode("result", message.value)
                            results.append(result)
                            progress.advance(task, len(result["rows"]))
                            latency = result["latency"] or {}
                            progress.console.print(
                                f"  {result['id']}: {len(result['rows'])} rows in "
                                f"{latency.get('total', 0):.2f} s"
                            )
    finally:
        await consumer.stop()
    return results


def _check_alive(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(process.args[-8:])} exited with {process.returncode}")


def _print_results(console: Console, results: list[dict]) -> None:
    table = Table(title="relQueries answered")
    for column in ("relQuery", "rows", "waiting", "core", "tail", "total", "first output"):
        table.add_column(
            column, justify="left" if column in ("relQuery", "first output") else "right"
        )
    for result in results:
        latency = result["latency"] or {}
        first = result["rows"][0] if result["rows"] else {}
        outputs = (first.get("output") or first.get("error") or "").replace("\n", " ")[:48]
        table.add_row(
            result["id"],
            str(len(result["rows"])),
            *(f"{latency.get(k, 0):.2f}" for k in ("waiting", "core", "tail", "total")),
            outputs,
        )
    console.print(table)
