"""`relstream reset`: a query's consumer group moved, so a stopped worker reads again."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import bootstrap_option, console, prefix_option, security_options
from relstream.kafka.security import KafkaSecurity


def _target(ctx, param, value: str):
    from relstream.kafka.reset import parse_target

    try:
        return parse_target(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@click.argument("query")
@click.option(
    "--to",
    "target",
    required=True,
    callback=_target,
    help="earliest, latest, an offset, or an ISO 8601 time (the first row at or after it).",
)
@bootstrap_option
@prefix_option
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The worker's [[query]] registrations, naming the query's table [default: the "
    "rows topics the group has committed on].",
)
@click.option("--app-id", default="relstream-worker", show_default=True, help="The worker's.")
@click.option("--dry-run", is_flag=True, help="Print each partition's move; commit nothing.")
@security_options
def reset(
    query: str,
    target,
    bootstrap: str,
    prefix: str,
    config_path: Path | None,
    app_id: str,
    dry_run: bool,
    security: KafkaSecurity,
) -> None:
    """Move the consumer group with which the worker reads QUERY's rows, on every partition
    of its rows topic, as kafka-consumer-groups --reset-offsets does; the next worker reads
    from there. Refused while a worker runs the group."""
    from relstream.kafka.reset import (
        GroupBusy,
        ResetError,
        check_idle,
        commit_moves,
        committed_topics,
        plan_moves,
    )
    from relstream.kafka.sync import sync_admin, sync_consumer
    from relstream.kafka.topics import Topics
    from relstream.stream.registrations import worker_group

    group = worker_group(app_id, query)
    admin = sync_admin(bootstrap, security)
    consumer = sync_consumer(bootstrap, security=security, enable_auto_commit=False)
    try:
        check_idle(admin, group)
        if config_path is not None:
            topic_names = [Topics(prefix).rows(_table(config_path, query))]
        else:
            topic_names = committed_topics(admin, group, prefix)
            if not topic_names:
                raise ResetError(
                    f"group {group} has committed no offsets on a rows topic under "
                    f"{prefix!r}: give --config to name query {query}'s table"
                )
        moves = [m for t in topic_names for m in plan_moves(consumer, admin, group, t, target)]
        if not dry_run:
            check_idle(admin, group)  # a worker started meanwhile
            commit_moves(admin, group, moves)
    except (GroupBusy, ResetError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        consumer.close()
        admin.close()
    verb = "would move" if dry_run else "moved"
    console.print(f"{verb} group {group} to {target}:", markup=False)
    for move in moves:
        console.print(f"  {move.line()}", markup=False)
    if dry_run:
        console.print("dry run: nothing committed", markup=False)


def _table(config_path: Path, query: str) -> str:
    from relstream.stream.registrations import RegistrationError, load_registrations

    try:
        registrations = load_registrations(config_path)
    except RegistrationError as exc:
        raise click.ClickException(str(exc)) from None
    for registration in registrations:
        if registration.name == query:
            return registration.table
    names = ", ".join(r.name for r in registrations)
    raise click.ClickException(f"{config_path} registers no query {query!r} (it has: {names})")
