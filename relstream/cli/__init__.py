"""`relstream ...`: one command group; each module below adds its commands."""

from __future__ import annotations

import os

import click

from relstream.cli.answers import answers
from relstream.cli.broker import broker
from relstream.cli.common import quiet_bootstrap_errors
from relstream.cli.demo import demo
from relstream.cli.engine import engine, serve
from relstream.cli.produce import produce
from relstream.cli.replay import replay
from relstream.cli.reset import reset
from relstream.cli.rows import deadletters, results, sink
from relstream.cli.status import status
from relstream.cli.usage import usage
from relstream.cli.weights import model
from relstream.cli.worker import worker
from relstream.extras import MissingExtra, extra_of, install_hint

# What the Kafka clients (aiokafka, kafka-python) raise when no broker answers. Matched by
# name: the worker's environment has no kafka-python to import them from.
UNREACHABLE = frozenset({"KafkaConnectionError", "NoBrokersAvailable", "KafkaTimeoutError"})
# The Python client's own errors, whose message already says what to check: no broker at
# the address, a reader's group that never got a partition, an embedded broker that did
# not start (its port taken, or its data dir in use).
SAID_IN_FULL = frozenset({"BrokerUnavailable", "ResultsUnavailable", "BrokerNotStarted"})
DEBUG_ENV = "RELSTREAM_DEBUG"  # set: an unreachable broker shows its traceback


class Commands(click.Group):
    """The command group, turning "no broker answered" (and a reader given no partition)
    and a missing extra into one line and exit status 1."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except MissingExtra as exc:
            raise click.ClickException(f"{ctx.invoked_subcommand} {exc}") from None
        except ModuleNotFoundError as exc:
            extra = extra_of(exc.name or "")
            if os.environ.get(DEBUG_ENV) or extra is None:
                raise
            raise click.ClickException(
                f"{ctx.invoked_subcommand} {install_hint([extra])} (no module {exc.name!r})"
            ) from None
        except Exception as exc:
            name = type(exc).__name__
            if os.environ.get(DEBUG_ENV) or name not in {*UNREACHABLE, *SAID_IN_FULL}:
                raise
            if name in SAID_IN_FULL:
                raise click.ClickException(str(exc)) from None
            raise click.ClickException(
                f"no Kafka broker answered ({exc}). Is one running at that address? "
                f"`relstream broker` starts one; {DEBUG_ENV}=1 shows the traceback."
            ) from None


@click.group(cls=Commands)
@click.version_option(package_name="relstream")
def main() -> None:
    """relstream: low-latency LLM queries over tables."""
    quiet_bootstrap_errors()  # a missing broker is the command's own one line


for command in (
    model,
    broker,
    engine,
    serve,
    worker,
    produce,
    results,
    sink,
    deadletters,
    replay,
    reset,
    status,
    usage,
    demo,
    answers,
):
    main.add_command(command)
