"""`relstream broker`: an embedded Kafka-protocol broker for trying relstream on one
machine."""

from __future__ import annotations

import signal
from pathlib import Path

import click
from click.core import ParameterSource

from relstream.cli.common import console, prefix_option, show_logs
from relstream.extras import require
from relstream.kafka.clients.topics import KEEP_DAYS
from relstream.kafka.tools.brokers import BROKERS, STORED_BROKER


@click.command()
@click.option(
    "--kind",
    type=click.Choice(BROKERS),
    default=STORED_BROKER,
    show_default=True,
    help="noida-db keeps topics on disk under --data-dir; tansu keeps them in memory only.",
)
@click.option(
    "--memory",
    is_flag=True,
    help="Keep topics in memory only (tansu): lost when the broker stops.",
)
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where noida-db keeps its topics (created if missing). Default: the user data "
    "dir, e.g. ~/.local/share/relstream/noida-db.",
)
@prefix_option
@click.option("--table", "tables", multiple=True, help="Also create the rows topic of TABLE.")
@click.option(
    "--keep-days",
    default=KEEP_DAYS,
    show_default=True,
    type=click.FloatRange(min=0.001),
    help="How long the topics it creates keep rows, relQueries, results and dead letters "
    "(a sink that was down reads what it missed within this); metrics a day at most.",
)
def broker(
    kind: str,
    memory: bool,
    port: int,
    data_dir: Path | None,
    prefix: str,
    tables: tuple[str, ...],
    keep_days: float,
) -> None:
    """Run an embedded Kafka-protocol broker on 127.0.0.1 until Ctrl-C. It keeps its topics
    on disk, so stopping and starting it loses nothing; --memory keeps them in memory."""
    from relstream.kafka.clients.topics import Topics
    from relstream.kafka.tools.brokers import EmbeddedBroker

    kind = _broker_kind(kind, memory, data_dir)
    require("broker")
    show_logs("relstream.kafka")  # a hanging transaction it aborts is said (kafka.delivery.hanging)

    # A Python handler, set before the broker starts, so SIGTERM unwinds through the
    # `finally` that stops it. (Blocking SIGTERM and sigwait-ing for it was not enough:
    # a thread started before the mask still took the signal's default, killing this
    # process and orphaning the broker; seen once in the test suite.)
    signal.signal(signal.SIGTERM, _interrupt)
    embedded = EmbeddedBroker(kind, port, data_dir, Topics(prefix), tables, keep_days)
    bootstrap = embedded.start()  # stops what it started where it fails
    try:
        console.print(f"{kind} ready: [bold]{bootstrap}[/] (topics under {prefix!r} created)")
        if embedded.data_path is not None:
            console.print(f"data in {embedded.data_path.resolve()} (kept when it stops)")
            console.print(_store_cost(embedded.data_path, keep_days), markup=False)
        else:
            console.print("memory only: every topic is lost when it stops")
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        embedded.stop()
        console.print(f"{kind} stopped")


def _store_cost(data: Path, keep_days: float) -> str:
    """One line on what noida-db's store costs: it keeps every topic in one file, written
    whole after any write, so its cost grows with what it holds (docs/operations.md)."""
    store = data / "kafka.json"
    size = store.stat().st_size / 1e6 if store.exists() else 0.0
    return (
        f"store {size:.0f} MB ({store.name}, written whole after any write; topics keep "
        f"{keep_days:g} days): its cost grows with what it holds; for heavy use, move to "
        "Kafka (docs/operations.md, The default broker at scale)"
    )


def _interrupt(_signum: int, _frame) -> None:
    raise KeyboardInterrupt


def _broker_kind(kind: str, memory: bool, data_dir: Path | None) -> str:
    """The kind to run: --memory means Tansu; a data dir means a broker that stores."""
    source = click.get_current_context().get_parameter_source("kind")
    if memory and kind != "tansu" and source is not ParameterSource.DEFAULT:
        raise click.UsageError(f"--memory runs tansu; {kind} keeps its topics on disk")
    kind = "tansu" if memory else kind
    if kind == "tansu" and data_dir is not None:
        raise click.UsageError("tansu keeps its topics in memory only: --data-dir is for noida-db")
    return kind
