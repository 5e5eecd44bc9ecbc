"""`relstream worker`: the Faust worker, which windows rows into relQueries."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import click

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    plain_log_config,
    prefix_option,
    security_options,
    show_logs,
)
from relstream.extras import MissingExtra
from relstream.kafka.clients.security import KafkaSecurity
from relstream.ready import clear_ready

TOPICS_TRIES = 60  # a second apart: the worker's topics made in a broker's restarts


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
    help="Written once every query reads its rows (its group joined), removed at start "
    "and stop: for launchers and healthchecks.",
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
@click.option(
    "--instance-id",
    envvar="RELSTREAM_INSTANCE_ID",
    default=None,
    help="This worker's static member id in each query's group, the same when it is "
    "restarted (docs/operations.md, Scale-out) [<hostname>-<n>, n the lowest slot free on "
    "this host].",
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
    instance_id: str | None,
    security: KafkaSecurity,
) -> None:
    """Run the Faust worker: windows of rows become relQueries (needs relstream[stream])."""
    from relstream.kafka.clients.aio import BrokerSilent
    from relstream.kafka.clients.topics import Topics
    from relstream.kafka.membership.static import member_slot
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
    try:  # a broker restarting is waited for, as by the engine (`check_broker`)
        asyncio.run(_topics_made(bootstrap, topics.layout(tables), security))
    except BrokerSilent as exc:
        raise click.ClickException(str(exc)) from None
    clear_ready(ready_file)  # a restarted container keeps the last run's file
    app = build_app(
        bootstrap, registrations, topics, app_id, broker_kind, security, ready_file, data_dir,
        instance_id,
    )  # fmt: skip
    if agents_path is not None:
        try:
            slot = member_slot(bootstrap, app_id, broker_kind, instance_id)  # Faust's consumer
            add_agents(app, topics, agents_path, slot.instance_id)
        except AgentsError as exc:
            raise click.ClickException(str(exc)) from None
    show_logs("relstream.worker")
    from relstream.kafka.delivery.publish import quiet_outages

    quiet_outages()  # a broker outage: one line per kind and period, with a count
    try:
        logs = plain_log_config()
        faust_worker = Worker(app, loglevel="WARNING", quiet=True, logging_config=logs)
        if logs is not None or not sys.stdout.isatty():
            faust_worker.spinner = None  # its cursor codes, off a terminal
        faust_worker.execute_from_commandline()
    finally:
        clear_ready(ready_file)


async def _topics_made(bootstrap: str, layout: dict[str, int], security: KafkaSecurity) -> None:
    """The worker's topics made, a broker restarting waited for: refused connections are
    tried again for `BROKER_CHECK_S` (then one line, `BrokerSilent`), and a request a
    restart cut after that is tried again with them."""
    from relstream.kafka.clients.aio import check_broker
    from relstream.kafka.clients.creation import create_topics
    from relstream.kafka.delivery.publish import unavailable

    for tries in range(TOPICS_TRIES, 0, -1):
        await check_broker(bootstrap, security)
        try:
            await create_topics(bootstrap, layout, security)
            return
        except Exception as exc:
            if not unavailable(exc) or tries == 1:
                raise
        await asyncio.sleep(1.0)
