"""What every `relstream` command shares: the console, progress bars, and the options
that many commands take (so each is spelled once)."""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from relstream.kafka.brokers import BROKERS
from relstream.scheduler import DEFAULT_POLICY, POLICIES

console = Console()

bootstrap_option = click.option(
    "--bootstrap", required=True, help="Kafka bootstrap address, host:port."
)
prefix_option = click.option(
    "--prefix", default="relstream.", show_default=True, help="Topic name prefix."
)
broker_kind_option = click.option(
    "--broker-kind",
    type=click.Choice(BROKERS),
    default=None,
    help="The embedded broker in use, for its client settings.",
)
policy_option = click.option(
    "--policy", type=click.Choice(list(POLICIES)), default=DEFAULT_POLICY, show_default=True
)


def broker_choice(default: str, help_text: str):
    """An option naming one of the embedded brokers."""
    return click.option(
        "--broker",
        "broker_kind",
        type=click.Choice(BROKERS),
        default=default,
        show_default=True,
        help=help_text,
    )


def progress() -> Progress:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    return Progress(*columns, console=console)
