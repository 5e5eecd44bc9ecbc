"""`relstream broker`: Apache Kafka on 127.0.0.1 for trying relstream on one machine, or
three nodes to watch failover; `--memory` a throwaway Tansu broker."""

from __future__ import annotations

import signal
from pathlib import Path

import click

from relstream.cli.common import console, prefix_option, show_logs
from relstream.extras import require
from relstream.kafka.clients.topics import KEEP_DAYS


@click.command()
@click.option(
    "--memory",
    is_flag=True,
    help="Run the memory-only Tansu broker instead: every topic is lost when it stops.",
)
@click.option(
    "--nodes",
    type=click.Choice(["1", "3"]),
    default="1",
    show_default=True,
    help="Apache Kafka nodes (KRaft, each broker and controller). 3 replicates every "
    "topic 3 with min.insync.replicas 2, on consecutive ports from --port.",
)
@click.option("--port", default=0, type=click.IntRange(0, 65535), help="0 picks a free port.")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where Kafka keeps its topics (created and formatted once if missing). Default: "
    "the user data dir, e.g. ~/.local/share/relstream/kafka.",
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
    memory: bool,
    nodes: str,
    port: int,
    data_dir: Path | None,
    prefix: str,
    tables: tuple[str, ...],
    keep_days: float,
) -> None:
    """Run Apache Kafka (KRaft) on 127.0.0.1 until Ctrl-C. It keeps its topics and
    committed offsets on disk, so stopping and starting it loses nothing."""
    from relstream.kafka.clients.topics import Topics
    from relstream.kafka.tools.brokers import BrokerNotStarted, EmbeddedBroker, default_data_dir

    if memory and (data_dir is not None or nodes != "1"):
        raise click.UsageError("--memory runs one Tansu node in memory: no --data-dir, --nodes")
    if memory:
        require("broker")
    show_logs("relstream.kafka")

    # A Python handler, set before the broker starts, so SIGTERM unwinds through the
    # `finally` that stops it. (Blocking SIGTERM and sigwait-ing for it was not enough:
    # a thread started before the mask still took the signal's default, killing this
    # process and orphaning the broker; seen once in the test suite.)
    signal.signal(signal.SIGTERM, _interrupt)
    kind = "tansu" if memory else "kafka"
    folder = None if memory else (data_dir or default_data_dir())
    embedded = EmbeddedBroker(
        kind, port, folder, Topics(prefix), tables, keep_days, nodes=int(nodes)
    )
    name = "Tansu" if memory else f"Apache Kafka ({nodes} node{'s' if nodes != '1' else ''})"
    try:
        bootstrap = embedded.start()  # stops what it started where it fails
    except (BrokerNotStarted, TimeoutError) as exc:
        raise click.ClickException(str(exc)) from None
    try:
        console.print(f"{name} ready: [bold]{bootstrap}[/] (topics under {prefix!r} created)")
        if folder is not None:
            console.print(f"data in {folder.resolve()} (kept when it stops)")
        else:
            console.print("memory only: every topic is lost when it stops")
        while True:
            signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        embedded.stop()
        console.print(f"{name} stopped")


def _interrupt(_signum: int, _frame) -> None:
    raise KeyboardInterrupt
