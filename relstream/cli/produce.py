"""`relstream produce`: rows in, from a file or a query, checked whole before any is sent;
an interrupted run says how many rows the broker has, and `--skip` sends the rest."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from relstream.cli.common import (
    console,
    prefix_option,
    progress,
    security_options,
    stop_signals,
)
from relstream.connectors.postgres import where
from relstream.kafka.clients.security import KafkaSecurity
from relstream.kafka.clients.topics import Topics
from relstream.wire import RowMessage

if TYPE_CHECKING:
    from relstream.stream.registrations import QueryRegistration


@click.command()
@click.argument("source")
@click.option(
    "--bootstrap", default=None, help="Kafka bootstrap address, host:port (not with --estimate)."
)
@click.option(
    "--estimate", is_flag=True,
    help="Send nothing: count the prompt tokens each query of --config would ask of the "
    "model for these rows (SmolLM2's tokenizer; docs/usage.md).",
)  # fmt: skip
@click.option(
    "--max-model-len", default=2048, show_default=True, type=click.IntRange(16),
    help="The engine's --max-model-len: with --config, rows whose prompt is longer are "
    "named before anything is sent (with --strict, refused); the model is never asked them.",
)  # fmt: skip
@click.option("--table", required=True, help="Table name: rows go to <prefix>rows.<table>.")
@click.option("--key-column", default=None, help="Column holding each row's key.")
@click.option("--query", default=None, help="SQL to run when SOURCE is a postgresql:// URL.")
@click.option(
    "--empty-strings",
    is_flag=True,
    help="Read empty CSV cells as empty strings; by default they are null, and a row whose "
    'template column is null is answered with status "null", never asked of the model.',
)
@click.option(
    "--delimiter",
    type=click.Choice([",", ";", "tab", "|"]),
    default=None,
    help="A CSV's delimiter [read from its header].",
)
@click.option(
    "--encoding",
    default="utf-8",
    show_default=True,
    help="A CSV's or JSONL's text encoding (cp1252, latin-1, ...).",
)
@click.option("--unique", is_flag=True, help="Refuse a source whose keys repeat.")
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="The workers' queries.toml: warn when none of its queries reads --table.",
)
@click.option(
    "--strict",
    is_flag=True,
    help="Refuse, sending nothing, where produce would warn of rows lacking a column.",
)
@click.option(
    "--create",
    is_flag=True,
    help="Send to a table no query of --config reads, or whose rows topic does not exist "
    "while others do (else refused: a typo in --table sends rows nobody reads).",
)
@click.option(
    "--skip",
    type=click.IntRange(0),
    default=0,
    help="Leave out the source's first N rows: those an interrupted run had on the broker "
    "(it says how many).",
)
@prefix_option
@security_options
def produce(
    source: str,
    bootstrap: str | None,
    estimate: bool,
    max_model_len: int,
    table: str,
    key_column: str | None,
    query: str | None,
    empty_strings: bool,
    delimiter: str | None,
    encoding: str,
    unique: bool,
    config: Path | None,
    strict: bool,
    create: bool,
    skip: int,
    prefix: str,
    security: KafkaSecurity,
) -> None:
    """Produce rows to the table's rows topic: SOURCE is a CSV, JSONL or Parquet file, or
    a postgresql:// URL with --query. Every row is read and checked before any is sent:
    a source with a bad row sends nothing, and the error names the row's line. Ctrl-C
    says how many rows the broker has; --skip N then sends the rest."""
    import codecs

    from relstream.connectors.sources import read_query, read_rows

    if estimate and config is None:
        raise click.UsageError("--estimate needs --config: the queries whose prompts it counts")
    if bootstrap is None and not estimate:
        raise click.UsageError("Missing option '--bootstrap'.")
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise click.BadParameter(
            f"unknown encoding {encoding!r}", param_hint="--encoding"
        ) from None
    readers = _check_readers(config, table, create) if config is not None else None
    try:
        if source.startswith(("postgresql://", "postgres://")):
            if not query:
                raise click.UsageError("a postgresql:// source needs --query")
            rows = list(read_query(source, query, table, key_column))
        else:
            path = Path(source)
            if not path.is_file():
                raise click.BadParameter(f"{source}: no such file", param_hint="SOURCE")
            delimiter = "\t" if delimiter == "tab" else delimiter
            rows = []  # an empty file is an empty table, as a header alone is
            if path.stat().st_size:
                rows = list(read_rows(path, table, key_column, empty_strings, delimiter, encoding))
    except ConnectionError as exc:  # PostgreSQL not reached: one line naming it
        raise click.ClickException(f"{exc}; 0 rows sent") from None
    except (ValueError, KeyError) as exc:
        said = str(exc)  # most name the file already: never twice
        shown = where(source) if source.startswith(("postgresql://", "postgres://")) else source
        said = said if said.startswith(source) else f"{shown}: {said}"
        raise click.ClickException(
            f"{said}; 0 rows sent (a source with a bad row is refused whole)"
        ) from None
    if not rows:  # an empty file, a header alone, an empty query: a mistake more often
        console.print(f"[yellow]warning: {source} has no rows: 0 rows sent[/]", soft_wrap=True)
        return
    if skip >= len(rows):
        raise click.BadParameter(
            f"{source} has {len(rows)} rows: --skip {skip} leaves none", param_hint="--skip"
        )
    _check_keys(rows, source, unique)
    _check_columns(readers or [], rows, source, strict)
    if estimate:
        _estimate(readers or [], rows[skip:], source, max_model_len)
        return
    _check_lengths(readers or [], rows[skip:], source, max_model_len, strict)
    read = None if readers is None else bool(readers)
    _produce_rows(bootstrap, prefix, table, rows, security, read, strict, create, skip)


def _check_readers(config: Path, table: str, create: bool) -> list[QueryRegistration]:
    """The queries of the workers' `config` that read `table`: where none does, rows sent
    there would never be asked, so a refusal naming the tables read (`create`: a
    warning, and they are sent)."""
    from relstream.stream.registrations import RegistrationError, load_registrations

    try:
        registrations = load_registrations(config)
    except RegistrationError as exc:
        raise click.ClickException(str(exc)) from None
    tables = sorted({r.table for r in registrations})
    if table in tables:
        return [r for r in registrations if r.table == table]
    said = f"no query in {config} reads table {table!r}; its queries read {', '.join(tables)}"
    if not create:
        raise click.ClickException(f"{said}: nothing was sent (--create sends them anyway)")
    console.print(f"[yellow]warning: {said}[/]", highlight=False, soft_wrap=True)  # whole paths
    return []


def _check_columns(
    readers: list[QueryRegistration], rows: list[RowMessage], source: str, strict: bool
) -> None:
    """Rows that lack a column a reading query's template names are dead-lettered by the
    worker (a typo such as `{reveiw}`, or the wrong file): a warning naming the columns
    and how many rows lack them, before anything is sent (`strict`: a refusal)."""
    from relstream.stream.windowing import needed_columns

    for registration in readers:
        needed = dict.fromkeys(needed_columns(registration))  # what the worker checks
        lacking = {c: sum(c not in row.values for row in rows) for c in needed}
        lacking = {c: n for c, n in lacking.items() if n}
        if not lacking:
            continue
        names = ", ".join("{" + c + "}" for c in lacking)
        said = (
            f"query {registration.name!r} uses {names}, which {max(lacking.values())} of "
            f"{len(rows)} rows of {source} lack: the worker dead-letters those rows"
        )
        if strict:
            raise click.ClickException(f"{said} (--strict: nothing was sent)")
        console.print(f"[yellow]warning: {said}[/]", highlight=False)


def _check_lengths(
    readers: list[QueryRegistration],
    rows: list[RowMessage],
    source: str,
    max_model_len: int,
    strict: bool,
) -> None:
    """Rows whose prompt (with its output budget) is over the context are answered with an
    error row, never asked: a warning naming a few and their lengths, before anything is
    sent (`strict`: a refusal). The estimate's count (`sim.estimate`)."""
    for registration, found in _estimates(readers, rows, max_model_len):
        if not found.too_long:
            continue
        named = ", ".join(f"{key!r} ({n:,} tokens)" for key, n in found.too_long_examples)
        more = ", ..." if found.too_long > len(found.too_long_examples) else ""
        said = (
            f"query {registration.name!r}: {found.too_long} of {len(rows)} rows of {source} "
            f"have a prompt over the context (--max-model-len {max_model_len} less "
            f"{registration.max_output_tokens} output tokens): {named}{more}; the engine "
            "answers them with an error row"
        )
        if strict:
            raise click.ClickException(f"{said} (--strict: nothing was sent)")
        console.print(f"[yellow]warning: {said}[/]", highlight=False)


def _estimates(readers: list[QueryRegistration], rows: list[RowMessage], max_model_len: int):
    """(registration, `Estimate`) for each reading query, as one relQuery of `rows`."""
    from relstream.model import RelQuery, Row
    from relstream.sim.estimate import estimate

    for registration in readers:
        relquery = RelQuery(
            registration.name, registration.template, [Row(r.key, r.values) for r in rows],
            registration.max_output_tokens, registration.system_prompt,
            output=registration.output, fields=registration.fields,
        )  # fmt: skip
        with console.status(f"tokenizing {len(rows):,} prompts of {registration.name}"):
            yield registration, estimate(relquery, max_model_len)


def _estimate(
    readers: list[QueryRegistration], rows: list[RowMessage], source: str, max_model_len: int
) -> None:
    """Each reading query's prompt tokens for `rows`, as one relQuery (nothing sent)."""
    from rich.table import Table

    table = Table(
        "query", "rows", "asked", "prompt tokens", "in shared blocks", "output tokens at most",
        "not asked", title=f"{source}: {len(rows)} rows, nothing sent",
        caption="SmolLM2's tokenizer and a 16-token block; rows not asked: null or empty "
        "input, a missing column, or a prompt over the context",
    )  # fmt: skip
    for registration, found in _estimates(readers, rows, max_model_len):
        table.add_row(
            registration.name, f"{found.rows:,}", f"{found.runnable:,}",
            f"{found.prompt_tokens:,}", f"{found.prefix_cached_share:.0%}",
            f"{found.output_budget:,}", f"{found.unrunnable + found.too_long:,}",
        )  # fmt: skip
    console.print(table)


def _check_keys(rows: list[RowMessage], source: str, unique: bool) -> None:
    """Keys that repeat make results that cannot be told apart: a warning naming a few,
    or with `unique` a refusal."""
    counts = Counter(row.key for row in rows)
    repeated = [key for key, count in counts.items() if count > 1]
    if not repeated:
        return
    examples = ", ".join(repr(key) for key in repeated[:5])
    said = (
        f"{source}: {len(repeated)} keys appear more than once ({examples}"
        f"{', ...' if len(repeated) > 5 else ''}); their results cannot be told apart"
    )
    if unique:
        raise click.ClickException(said)
    console.print(f"[yellow]warning: {said} (--unique refuses such a source)[/]")


def _produce_rows(
    bootstrap: str,
    prefix: str,
    table: str,
    rows: list[RowMessage],
    security: KafkaSecurity,
    read: bool | None,
    strict: bool,
    create: bool,
    skip: int,
) -> None:
    """Send `rows` from the `skip`th, creating the topics first. `read`: whether the
    workers' queries read `table` (None: not known; then a rows topic that does not exist
    while others do is refused as a likely typo, unless `create`; `strict` refuses any
    that does not exist)."""
    from relstream.client import RelstreamClient
    from relstream.kafka.clients.creation import create_topics

    topics = Topics(prefix)
    listed = asyncio.run(create_topics(bootstrap, {}, security))  # lists, creates none
    if read is None and topics.rows(table) not in listed:  # a typo, or a new table
        tables = sorted(
            n.removeprefix(topics.rows("")) for n in listed if n.startswith(topics.rows(""))
        )
        if strict:
            raise click.ClickException(
                f"{topics.rows(table)} does not exist, so no worker reads it yet (--config "
                "names the queries that will); --strict: nothing was sent"
            )
        if tables and not create:
            raise click.ClickException(
                f"{topics.rows(table)} does not exist; tables with rows topics: "
                f"{', '.join(tables)}. A typo in --table? Nothing was sent (--create makes "
                "it: a worker reads only the tables of its [[query]] registrations)"
            )
        console.print(f"{topics.rows(table)} created: a worker reads it once a query names it")
    asyncio.run(create_topics(bootstrap, topics.layout((table,)), security))
    topic = topics.rows(table)
    sending = rows[skip:]
    with (
        stop_signals() as stop,  # Ctrl-C: no more rows sent, then what the broker has
        RelstreamClient(bootstrap, prefix, security) as client,
        progress() as bar,
    ):
        task = bar.add_task(f"producing to {topic}", total=len(sending))
        try:
            sent = client.produce_rows(table, sending, on_sent=lambda: bar.advance(task), stop=stop)
        except ValueError as exc:  # a row too large for the worker
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:  # a second Ctrl-C: sent rows not waited for
            sent = -1
        if sent != len(sending):
            bar.stop()
            have = skip + client.acknowledged(wait_s=5.0)
            raise click.ClickException(
                f"interrupted: the broker has the first {have} of {len(rows)} rows of "
                f"{topic}; run again with --skip {have} to send the rest"
            )
    skipped = f" (the first {skip} skipped)" if skip else ""
    console.print(f"produced {len(sending)} rows to {topic}{skipped}")
