"""`relstream broker | worker`: the broker and the Faust worker of the streaming path
(the engine is in `cli.engine`)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import click
from click.core import ParameterSource

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    console,
    prefix_option,
    security_options,
    show_logs,
)
from relstream.extras import MissingExtra, require
from relstream.kafka.brokers import BROKERS, STORED_BROKER
from relstream.kafka.security import KafkaSecurity


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
    help="Keep topics in memory only (tansu): lost when the broker stops, but an idle "
    "consumer costs ~1 % of a core instead of most of one.",
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
def broker(
    kind: str,
    memory: bool,
    port: int,
    data_dir: Path | None,
    prefix: str,
    tables: tuple[str, ...],
) -> None:
    """Run an embedded Kafka-protocol broker on 127.0.0.1 until Ctrl-C. It keeps its topics
    on disk, so stopping and starting it loses nothing; --memory keeps them in memory."""
    from relstream.kafka.brokers import EmbeddedBroker
    from relstream.kafka.topics import Topics

    kind = _broker_kind(kind, memory, data_dir)
    require("broker")

    # A Python handler, set before the broker starts, so SIGTERM unwinds through the
    # `finally` that stops it. (Blocking SIGTERM and sigwait-ing for it was not enough:
    # a thread started before the mask still took the signal's default, killing this
    # process and orphaning the broker; seen once in the test suite.)
    signal.signal(signal.SIGTERM, _interrupt)
    embedded = EmbeddedBroker(kind, port, data_dir, Topics(prefix), tables)
    try:
        bootstrap = embedded.start()
        console.print(f"{kind} ready: [bold]{bootstrap}[/] (topics under {prefix!r} created)")
        if embedded.data_path is not None:
            console.print(f"data in {embedded.data_path.resolve()} (kept when it stops)")
        else:
            console.print("memory only: every topic is lost when it stops")
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        embedded.stop()
        console.print(f"{kind} stopped")


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
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Written once every query reads its rows (removed at start): for healthchecks.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where Faust keeps the worker's data, under a folder named by --app-id. Default: "
    "the user data dir, e.g. ~/.local/share/relstream/worker.",
)
@click.option(
    "--agents",
    "agents_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A Python file whose agents(app, topics) adds your own Faust agents to the "
    "worker's app, e.g. to filter or enrich rows before they are windowed.",
)
@security_options
def worker(
    config_path: Path,
    bootstrap: str,
    prefix: str,
    broker_kind: str | None,
    app_id: str,
    ready_file: Path | None,
    data_dir: Path | None,
    agents_path: Path | None,
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

        from relstream.stream.app import AgentsError, add_agents, build_app
    except ImportError:
        raise MissingExtra(["stream"]) from None
    topics = Topics(prefix)
    tables = tuple({r.table for r in registrations})
    asyncio.run(create_topics(bootstrap, topics.layout(tables), security))
    if ready_file is not None:  # a restarted container keeps the last run's file
        ready_file.unlink(missing_ok=True)
    app = build_app(
        bootstrap, registrations, topics, app_id, broker_kind, security, ready_file, data_dir
    )
    if agents_path is not None:
        try:
            add_agents(app, topics, agents_path)
        except AgentsError as exc:
            raise click.ClickException(str(exc)) from None
    show_logs("relstream.worker")
    from relstream.kafka.delivery import quiet_outages

    quiet_outages()  # a broker outage: one line per kind and period, with a count
    Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()
