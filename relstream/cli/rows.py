"""`relstream produce | results | sink`: rows in, results out, from any Kafka cluster."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    console,
    prefix_option,
    progress,
    security_options,
)
from relstream.kafka.security import KafkaSecurity
from relstream.schemas import MessageError, ResultMessage, RowMessage, decode, encode


@click.command()
@click.argument("source")
@bootstrap_option
@click.option("--table", required=True, help="Table name: rows go to <prefix>rows.<table>.")
@click.option("--key-column", default=None, help="Column holding each row's key.")
@click.option("--query", default=None, help="SQL to run when SOURCE is a postgresql:// URL.")
@prefix_option
@security_options
def produce(
    source: str,
    bootstrap: str,
    table: str,
    key_column: str | None,
    query: str | None,
    prefix: str,
    security: KafkaSecurity,
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
    asyncio.run(_produce_rows(bootstrap, prefix, table, rows, security))


async def _produce_rows(
    bootstrap: str, prefix: str, table: str, rows: list[RowMessage], security: KafkaSecurity
) -> None:
    from relstream.kafka.clients import create_topics, produce
    from relstream.kafka.topics import Topics

    topics = Topics(prefix)
    await create_topics(bootstrap, topics.layout((table,)), security)
    with progress() as bar:
        task = bar.add_task(f"producing to {topics.rows(table)}", total=len(rows))
        messages = ((row.key.encode(), encode(row)) for row in rows)
        await produce(
            bootstrap,
            topics.rows(table),
            messages,
            on_sent=lambda: bar.advance(task),
            security=security,
            linger_ms=5,
        )
    console.print(f"produced {len(rows)} rows to {topics.rows(table)}")


@click.command()
@bootstrap_option
@prefix_option
@click.option("--follow", is_flag=True, help="Keep waiting for new results.")
@broker_kind_option
@security_options
def results(
    bootstrap: str, prefix: str, follow: bool, broker_kind: str | None, security: KafkaSecurity
) -> None:
    """Print results from the results topic (from the beginning)."""
    group = f"relstream-results-{uuid.uuid4().hex[:8]}"
    reader = ResultReader(bootstrap, prefix, group, follow, broker_kind, security)
    asyncio.run(reader.for_each(_print_result))


@click.command()
@click.argument("target")
@bootstrap_option
@prefix_option
@click.option("--group", default="relstream-sink", show_default=True, help="Consumer group.")
@click.option("--follow", is_flag=True, help="Keep consuming new results.")
@broker_kind_option
@security_options
def sink(
    target: str,
    bootstrap: str,
    prefix: str,
    group: str,
    follow: bool,
    broker_kind: str | None,
    security: KafkaSecurity,
) -> None:
    """Store results in TARGET: a .jsonl or .csv file, or a postgresql:// URL (idempotent
    on relQuery id)."""
    from relstream.connectors.sinks import open_sink

    try:
        store = open_sink(target)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
    try:
        reader = ResultReader(bootstrap, prefix, group, follow, broker_kind, security)
        written = asyncio.run(reader.for_each(store.write))
    finally:
        store.close()
    console.print(f"stored {written} new results in {target}")


@dataclass(frozen=True)
class ResultReader:
    """The results topic, read by one consumer group (the `results` and `sink` commands)."""

    bootstrap: str
    prefix: str
    group: str
    follow: bool  # keep waiting for new results; else stop after 3 idle seconds
    broker_kind: str | None
    security: KafkaSecurity

    async def for_each(self, handle: Callable[[ResultMessage], object]) -> int:
        """Call `handle(result)` for each result from the group's offsets, committing
        each batch once handled. Returns how many calls returned a true value."""
        from relstream.kafka.clients import Subscription
        from relstream.kafka.topics import Topics

        subscription = Subscription(
            self.bootstrap,
            Topics(self.prefix).results,
            broker_kind=self.broker_kind,
            group=self.group,
            idle_seconds=None if self.follow else 3.0,
            commit=True,
            security=self.security,
        )
        counted = 0
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
