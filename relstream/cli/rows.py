"""`relstream produce | results | sink`: rows in, results out, from any Kafka cluster."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import click

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    console,
    prefix_option,
    progress,
)
from relstream.schemas import MessageError, ResultMessage, RowMessage, decode, encode


@click.command()
@click.argument("source")
@bootstrap_option
@click.option("--table", required=True, help="Table name: rows go to <prefix>rows.<table>.")
@click.option("--key-column", default=None, help="Column holding each row's key.")
@click.option("--query", default=None, help="SQL to run when SOURCE is a postgresql:// URL.")
@prefix_option
def produce(
    source: str, bootstrap: str, table: str, key_column: str | None, query: str | None, prefix: str
) -> None:
    """Produce rows to the table's rows topic: SOURCE is a CSV, JSONL or Parquet file, or
    a postgresql:// URL with --query."""
    from relstream.connectors.sources import read_query, read_rows

    try:
        if source.startswith(("postgresql://", "postgres://")):
            if not query:
                raise click.UsageError("a postgresql:// source needs --query")
            rows = list(read_query(source, query, table, key_column))
        else:
            path = Path(source)
            if not path.is_file():
                raise click.BadParameter(f"{source}: no such file", param_hint="SOURCE")
            rows = list(read_rows(path, table, key_column))
    except (ValueError, KeyError) as exc:
        raise click.ClickException(f"{source}: {exc}") from None
    asyncio.run(_produce_rows(bootstrap, prefix, table, rows))


async def _produce_rows(bootstrap: str, prefix: str, table: str, rows: list[RowMessage]) -> None:
    from relstream.kafka.clients import create_topics, produce
    from relstream.kafka.topics import Topics

    topics = Topics(prefix)
    await create_topics(bootstrap, topics.layout((table,)))
    with progress() as bar:
        task = bar.add_task(f"producing to {topics.rows(table)}", total=len(rows))
        messages = ((row.key.encode(), encode(row)) for row in rows)
        await produce(
            bootstrap,
            topics.rows(table),
            messages,
            on_sent=lambda: bar.advance(task),
            linger_ms=5,
        )
    console.print(f"produced {len(rows)} rows to {topics.rows(table)}")


@click.command()
@bootstrap_option
@prefix_option
@click.option("--follow", is_flag=True, help="Keep waiting for new results.")
@broker_kind_option
def results(bootstrap: str, prefix: str, follow: bool, broker_kind: str | None) -> None:
    """Print results from the results topic (from the beginning)."""
    group = f"relstream-results-{uuid.uuid4().hex[:8]}"
    asyncio.run(for_each_result(bootstrap, prefix, group, follow, broker_kind, _print_result))


@click.command()
@click.argument("target")
@bootstrap_option
@prefix_option
@click.option("--group", default="relstream-sink", show_default=True, help="Consumer group.")
@click.option("--follow", is_flag=True, help="Keep consuming new results.")
@broker_kind_option
def sink(
    target: str, bootstrap: str, prefix: str, group: str, follow: bool, broker_kind: str | None
) -> None:
    """Store results in TARGET: a .jsonl or .csv file, or a postgresql:// URL (idempotent
    on relQuery id)."""
    from relstream.connectors.sinks import open_sink

    try:
        store = open_sink(target)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
    try:
        written = asyncio.run(
            for_each_result(bootstrap, prefix, group, follow, broker_kind, store.write)
        )
    finally:
        store.close()
    console.print(f"stored {written} new results in {target}")


async def for_each_result(
    bootstrap: str,
    prefix: str,
    group: str,
    follow: bool,
    broker_kind: str | None,
    handle: Callable[[ResultMessage], object],
) -> int:
    """Call `handle(result)` for each result from the group's offsets, committing each
    batch once handled. Stops after 3 idle seconds unless following. Returns how many
    calls returned a true value."""
    from relstream.kafka.clients import Subscription
    from relstream.kafka.topics import Topics

    counted = 0
    subscription = Subscription(
        bootstrap,
        Topics(prefix).results,
        broker_kind=broker_kind,
        group=group,
        idle_seconds=None if follow else 3.0,
        commit=True,
    )
    async with subscription as messages:
        async for message in messages:
            try:
                counted += bool(handle(decode(ResultMessage, message.value)))
            except MessageError as exc:
                console.print(
                    f"[red]skipped unreadable result at offset {message.offset}: {exc}[/]"
                )
    return counted


def _print_result(result: ResultMessage) -> None:
    latency = result.latency
    parts = ""
    if latency is not None:
        parts = " ".join(
            f"{name} {getattr(latency, name):.2f}s"
            for name in ("queued", "waiting", "core", "tail", "total")
        )
    console.print(f"[bold]{result.id}[/] {len(result.rows)} rows ({result.policy}) {parts}")
    for row in result.rows[:3]:
        text = row.output if row.status == "ok" else f"[red]{row.error}[/]"
        console.print(f"  {row.key}: {text}")
