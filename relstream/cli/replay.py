"""`relstream replay`: dead letters sent back to the topic they came from."""

from __future__ import annotations

import asyncio

import click

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    console,
    prefix_option,
    security_options,
)
from relstream.kafka.clients.security import KafkaSecurity


def _time(ctx, param, value: str | None) -> float | None:
    from relstream.kafka.tools.replay import parse_time

    if value is None:
        return None
    try:
        return parse_time(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.command()
@bootstrap_option
@prefix_option
@click.option("--reason", help="Only letters whose reason matches this regular expression.")
@click.option(
    "--topic", "origin", help="Only letters from this topic (e.g. relstream.rows.reviews)."
)
@click.option("--since", callback=_time, help="Only letters written at or after this time.")
@click.option("--until", callback=_time, help="Only letters written before this time.")
@click.option("--dry-run", is_flag=True, help="Count what would be sent; send nothing.")
@broker_kind_option
@security_options
def replay(
    bootstrap: str,
    prefix: str,
    reason: str | None,
    origin: str | None,
    since: float | None,
    until: float | None,
    dry_run: bool,
    broker_kind: str | None,
    security: KafkaSecurity,
) -> None:
    """Send dead letters back to the topic they came from, once their cause is fixed (a
    template corrected, a registration added). Times are ISO 8601 (local unless they
    say otherwise) or seconds since 1970. Replaying a letter twice sends it twice."""
    from relstream.client import RelstreamClient
    from relstream.kafka.clients.aio import produce
    from relstream.kafka.tools.refetch import refetch
    from relstream.kafka.tools.replay import LetterFilter, plan_replay

    try:
        chosen = LetterFilter(reason, origin, since, until)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--reason") from None
    with RelstreamClient(bootstrap, prefix, security, broker_kind) as client:
        plan = plan_replay(client.dead_letters(follow=False, idle_seconds=0), chosen)
    gone: list[str] = []
    if plan.cut:  # their originals, read again where they came from
        found = asyncio.run(refetch(bootstrap, plan.cut, security, broker_kind))
        plan.add(found.messages, found.read)
        gone = found.gone
    verb = "would send" if dry_run else "sent"
    if not dry_run:
        for topic, messages in plan.messages.items():
            asyncio.run(produce(bootstrap, topic, messages, security=security))
        _mark(bootstrap, prefix, security, plan.refs)
    console.print(f"{verb} {plan.count} dead letters back", markup=False)
    for topic, count in sorted(plan.by_topic.items()):
        console.print(f"  {topic}: {count}", markup=False)
    if plan.cut:
        console.print(
            f"{len(plan.cut) - len(gone)} of them held only the first bytes of their message "
            "(too large to keep whole): read again from where it came",
            markup=False,
        )
    if gone:
        console.print(
            f"{len(gone)} chosen letters cannot go back: their message was too large to "
            f"keep whole and its topic no longer has it, e.g. {gone[0]}",
            markup=False,
        )
    console.print(f"{plan.skipped} letters not chosen", markup=False)


def _mark(bootstrap: str, prefix: str, security: KafkaSecurity, refs: list) -> None:
    """The letters sent back (`refs`), marked as replayed on the dead-letter topic, after
    they were sent: a mark never names a letter that did not go back."""
    import time

    from relstream.kafka.clients.aio import produce
    from relstream.kafka.clients.topics import Topics
    from relstream.kafka.tools.replay import MARK_HEADERS, marks
    from relstream.wire import encode

    found = [(b"replayed", encode(mark)) for mark in marks(refs, time.time())]
    if found:
        topic = Topics(prefix).deadletter
        asyncio.run(produce(bootstrap, topic, found, security=security, headers=MARK_HEADERS))
