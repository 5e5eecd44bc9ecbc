"""`relstream reset`: a query's consumer group moved, so a stopped worker reads again."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import bootstrap_option, console, prefix_option, security_options
from relstream.kafka.clients.security import KafkaSecurity


def _target(ctx, param, value: str):
    from relstream.kafka.tools.reset import parse_target

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
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print each partition's move and the rows read again (with --config: in which "
    "windows, under which ids); commit nothing.",
)
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
    from there. A target before the committed offset snaps back to the start of its
    window, so the rows read again come under the ids they had. Refused while a worker
    runs the group."""
    from relstream.kafka.clients.sync import sync_admin, sync_consumer
    from relstream.kafka.clients.topics import Topics
    from relstream.kafka.tools.reset import (
        GroupBusy,
        ResetError,
        check_idle,
        commit_moves,
        committed_topics,
        plan_moves,
    )
    from relstream.kafka.tools.windowstarts import known_starts
    from relstream.stream.registrations import worker_group

    group = worker_group(app_id, query)
    admin = sync_admin(bootstrap, security)
    consumer = sync_consumer(bootstrap, security=security, enable_auto_commit=False)
    try:
        check_idle(admin, group)
        registration = None if config_path is None else _registration(config_path, query)
        if registration is not None:
            topic_names = [Topics(prefix).rows(registration.table)]
        else:
            topic_names = committed_topics(admin, group, prefix)
            if not topic_names:
                raise ResetError(
                    f"group {group} has committed no offsets on a rows topic under "
                    f"{prefix!r}: give --config to name query {query}'s table"
                )
        published = _published(consumer, Topics(prefix))
        starts = known_starts(published, query)
        moves = [
            move
            for name in topic_names
            for move in plan_moves(consumer, admin, group, name, target, starts)
        ]
        recuts = {}
        if dry_run and registration is not None:
            limit = _message_limit(bootstrap, Topics(prefix).relqueries, security)
            recuts = {
                m: _recut(consumer, registration, m, published, limit) for m in moves if m.again()
            }
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
        # With the windows recut (a dry run with --config), what a sink makes of the rows
        # is told from them, window by window: the guess from the snap alone said "under
        # the ids they had" above windows it then listed under new ids.
        said = [move.sinks()]
        if move in recuts:
            said = _recut_lines(move, recuts[move], registration.name)
        for line in filter(None, said):
            console.print(f"    {line}", markup=False, soft_wrap=True)  # one line each
    if dry_run:
        console.print("dry run: nothing committed", markup=False)


def _registration(config_path: Path, query: str):
    from relstream.stream.registrations import RegistrationError, load_registrations

    try:
        registrations = load_registrations(config_path)
    except RegistrationError as exc:
        raise click.ClickException(str(exc)) from None
    for registration in registrations:
        if registration.name == query:
            return registration
    names = ", ".join(r.name for r in registrations)
    raise click.ClickException(f"{config_path} registers no query {query!r} (it has: {names})")


def _published(consumer, topics) -> set[str]:
    """Every relQuery id on the relqueries and results topics: the windows published."""
    from relstream.kafka.tools.windowstarts import published_ids

    return set(published_ids(consumer, [topics.relqueries, topics.results]))


def _message_limit(bootstrap: str, topic: str, security: KafkaSecurity) -> int:
    """The byte limit the worker cuts windows under (`kafka.clients.limits.message_limit`)."""
    import asyncio

    from relstream.kafka.clients.limits import message_limit

    return asyncio.run(message_limit(bootstrap, topic, security))


def _recut(consumer, registration, move, published: set[str], message_bytes: int):
    """The windows the worker will cut from the rows `move` reads again."""
    from relstream.kafka.clients.bounds import Span
    from relstream.stream.recut import recut

    first, last = move.again()
    records = Span(consumer, {move.partition: (first, last + 1)}, None)
    return recut(registration, move.partition.partition, records, published, message_bytes)


def _recut_lines(move, found, query: str) -> list[str]:
    """A dry run's account of the windows cut again, each new one named."""
    known, new = found.known, found.new
    first, last = move.again()
    stored = "sinks store each once" if not new else "a sink stores the new ones' rows again"
    lines = [
        f"offsets {first}..{last} ({last - first + 1}) are read again: "
        f"{len(known)} window(s) of {found.rows(known)} row(s) under the ids they had, "
        f"{len(new)} of {found.rows(new)} row(s) under new ids ({stored}); "
        f"{found.rejected} row(s) dead-lettered again"
    ]
    for window in new:
        lines.append(
            f"new: {window.window_id(query)} (offsets {window.first_offset}..{window.last_offset}, "
            f"{len(window.rows)} row(s)): a sink stores these rows a second time"
        )
    return lines
