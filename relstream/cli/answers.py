"""`relstream answers purge`: drop every answer the engines keep on the answers topic."""

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


@click.group()
def answers() -> None:
    """The answer cache's topic (<prefix>answers)."""


@answers.command()
@bootstrap_option
@prefix_option
@broker_kind_option
@click.option("--yes", is_flag=True, help="Confirm: every engine forgets every answer.")
@security_options
def purge(bootstrap: str, prefix: str, broker_kind: str | None, yes: bool, security) -> None:
    """Tombstone every answer on <prefix>answers: running engines drop them as they read
    the tombstones, restarted ones never load them, and compaction deletes them."""
    from relstream.kafka.clients.topics import Topics
    from relstream.service.answercache import purge_answers

    topic = Topics(prefix).answers
    if not yes:
        raise click.UsageError(f"purging {topic} drops every engine's answers: add --yes")
    purged = asyncio.run(purge_answers(bootstrap, topic, broker_kind, security))
    console.print(f"{purged} answers tombstoned on {topic}")
