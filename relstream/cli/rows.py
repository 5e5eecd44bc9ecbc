"""`relstream produce | results | sink`: rows in, results out, from any Kafka cluster."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import click

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    console,
    prefix_option,
    progress,
    security_options,
    stop_signals,
)
from relstream.cli.show import print_result, print_skipped
from relstream.kafka.security import KafkaSecurity
from relstream.kafka.topics import Topics
from relstream.wire import RowMessage

if TYPE_CHECKING:
    from relstream.stream.registrations import QueryRegistration


@click.command()
@click.argument("source")
@bootstrap_option
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
    help="Refuse, sending nothing, where produce would warn that no query reads --table.",
)
@prefix_option
@security_options
def produce(
    source: str,
    bootstrap: str,
    table: str,
    key_column: str | None,
    query: str | None,
    empty_strings: bool,
    delimiter: str | None,
    encoding: str,
    unique: bool,
    config: Path | None,
    strict: bool,
    prefix: str,
    security: KafkaSecurity,
) -> None:
    """Produce rows to the table's rows topic: SOURCE is a CSV, JSONL or Parquet file, or
    a postgresql:// URL with --query. Every row is read and checked before any is sent:
    a source with a bad row sends nothing, and the error names the row's line."""
    import codecs

    from relstream.connectors.sources import read_query, read_rows

    try:
        codecs.lookup(encoding)
    except LookupError:
        raise click.BadParameter(
            f"unknown encoding {encoding!r}", param_hint="--encoding"
        ) from None
    readers = _check_readers(config, table, strict) if config is not None else None
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
            rows = list(read_rows(path, table, key_column, empty_strings, delimiter, encoding))
    except (ValueError, KeyError) as exc:
        said = str(exc)  # most name the file already: never twice
        said = said if said.startswith(source) else f"{source}: {said}"
        raise click.ClickException(
            f"{said}; 0 rows sent (a source with a bad row is refused whole)"
        ) from None
    if not rows:  # a header alone, an empty table or query: a mistake more often than not
        console.print(f"[yellow]warning: {source} has no rows: 0 rows sent[/]", soft_wrap=True)
        return
    _check_keys(rows, source, unique)
    _check_columns(readers or [], rows, source, strict)
    read = None if readers is None else bool(readers)
    _produce_rows(bootstrap, prefix, table, rows, security, read, strict)


def _check_readers(config: Path, table: str, strict: bool) -> list[QueryRegistration]:
    """The queries of the workers' `config` that read `table`: where none does, rows sent
    there would never be asked, so a warning naming the tables read (`strict`: a
    refusal)."""
    from relstream.stream.registrations import RegistrationError, load_registrations

    try:
        registrations = load_registrations(config)
    except RegistrationError as exc:
        raise click.ClickException(str(exc)) from None
    tables = sorted({r.table for r in registrations})
    if table in tables:
        return [r for r in registrations if r.table == table]
    said = f"no query in {config} reads table {table!r}; its queries read {', '.join(tables)}"
    if strict:
        raise click.ClickException(f"{said} (--strict: nothing was sent)")
    console.print(f"[yellow]warning: {said}[/]", highlight=False, soft_wrap=True)  # whole paths
    return []


def _check_columns(
    readers: list[QueryRegistration], rows: list[RowMessage], source: str, strict: bool
) -> None:
    """Rows that lack a column a reading query's template names are dead-lettered by the
    worker (a typo such as `{reveiw}`, or the wrong file): a warning naming the columns
    and how many rows lack them, before anything is sent (`strict`: a refusal)."""
    for registration in readers:
        needed = dict.fromkeys((*registration.template.columns, *registration.fields))
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
) -> None:
    """Send `rows`, creating the topics first. `read`: whether the workers' queries read
    `table` (None: not known, so a rows topic that did not exist is warned of; `strict`
    refuses it before creating anything)."""
    from relstream.client import RelstreamClient
    from relstream.kafka.clients import create_topics

    topics = Topics(prefix)
    if strict and read is None:
        listed = asyncio.run(create_topics(bootstrap, {}, security))  # lists, creates none
        if topics.rows(table) not in listed:
            raise click.ClickException(
                f"{topics.rows(table)} does not exist, so no worker reads it yet (--config "
                "names the queries that will); --strict: nothing was sent"
            )
    existing = asyncio.run(create_topics(bootstrap, topics.layout((table,)), security))
    if read is None and topics.rows(table) not in existing:  # a typo, or a new table
        tables = sorted(
            n.removeprefix(topics.rows("")) for n in existing if n.startswith(topics.rows(""))
        )
        console.print(
            f"[yellow]warning: {topics.rows(table)} did not exist (created now); a worker "
            f"reads only the tables of its [[query]] registrations. Tables with rows topics: "
            f"{', '.join(tables) or 'none'}[/]"
        )
    with RelstreamClient(bootstrap, prefix, security) as client, progress() as bar:
        topic = client.topics.rows(table)
        task = bar.add_task(f"producing to {topic}", total=len(rows))
        try:
            client.produce_rows(table, rows, on_sent=lambda: bar.advance(task))
        except ValueError as exc:  # a row too large for the worker
            raise click.ClickException(str(exc)) from None
    console.print(f"produced {len(rows)} rows to {topic}")


@click.command()
@bootstrap_option
@prefix_option
@click.option("--follow", is_flag=True, help="Keep waiting for new results.")
@click.option("--query", "queries", multiple=True, help="Only this query's windows (repeatable).")
@click.option("--id", "ids", multiple=True, help="Only the relQuery with this id (repeatable).")
@click.option("--all", "every_row", is_flag=True, help="Every row of each result, not 3.")
@broker_kind_option
@security_options
def results(
    bootstrap: str,
    prefix: str,
    follow: bool,
    queries: tuple[str, ...],
    ids: tuple[str, ...],
    every_row: bool,
    broker_kind: str | None,
    security: KafkaSecurity,
) -> None:
    """Print results from the results topic (from the beginning, to its end now unless
    following; joins no consumer group): each relQuery's rows by status, then its first
    rows, those that did not answer first."""
    from relstream.client import RelstreamClient

    try:
        with (
            stop_signals() as stop,
            RelstreamClient(bootstrap, prefix, security, broker_kind) as client,
        ):
            results = client.results(
                follow=follow, idle_seconds=0, on_unreadable=print_skipped, stop=stop
            )
            for result in results:
                if _chosen(result.id, queries, ids):
                    print_result(result, None if every_row else SHOWN_ROWS)
    except KeyboardInterrupt:  # a second Ctrl-C (`stop_signals`): no "Aborted!"
        pass


SHOWN_ROWS = 3  # rows `results` prints of each relQuery unless --all


def _chosen(relquery_id: str, queries: tuple[str, ...], ids: tuple[str, ...]) -> bool:
    """Whether `results --query/--id` asked for this relQuery (all when neither is given):
    a window's id starts with its query's name and a dash."""
    if not queries and not ids:
        return True
    return relquery_id in ids or any(relquery_id.startswith(f"{q}-") for q in queries)


@click.command()
@click.argument("target")
@bootstrap_option
@prefix_option
@click.option(
    "--group",
    default=None,
    help="Consumer group [relstream-sink-<file name>-<hash of its path>: one per target].",
)
@click.option("--follow", is_flag=True, help="Keep consuming new results.")
@click.option(
    "--with-input",
    is_flag=True,
    help="Add each row's input values, read from the relqueries topic.",
)
@broker_kind_option
@security_options
def sink(
    target: str,
    bootstrap: str,
    prefix: str,
    group: str | None,
    follow: bool,
    with_input: bool,
    broker_kind: str | None,
    security: KafkaSecurity,
) -> None:
    """Store results in TARGET: a .jsonl or .csv file, or a postgresql:// URL (idempotent
    on relQuery id), each row with its query's name; --with-input adds its input values."""
    from relstream.client import RelstreamClient
    from relstream.connectors.sinks import default_group, open_sink
    from relstream.kafka.inputs import RelQueryInputs

    group = group or default_group(target)
    inputs = None
    if with_input:
        inputs = RelQueryInputs(bootstrap, Topics(prefix).relqueries, security)
    try:
        store = open_sink(target, inputs.rows if inputs is not None else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
    from relstream.client import ResultsUnavailable

    written = 0
    try:
        with (
            stop_signals() as stop,
            RelstreamClient(bootstrap, prefix, security, broker_kind) as client,
        ):
            # The client commits a batch only once every result in it is stored and
            # made durable (`store.sync`): a crash or a full disk loses nothing.
            results = client.results(
                group, follow, on_unreadable=print_skipped, stop=stop, before_commit=store.sync
            )
            try:
                for result in results:
                    written += bool(store.write(result))
            except OSError as exc:  # a full disk: what was not stored stays unread
                raise click.ClickException(
                    f"could not store results in {target} ({exc}); what was not stored "
                    f"whole is cut from it, and group {group!r} has not moved past it"
                ) from None
    except ResultsUnavailable as exc:
        raise click.ClickException(f"{exc}; stored {written} results in {target}") from None
    except KeyboardInterrupt:  # a second Ctrl-C: what was stored, then quiet
        pass
    finally:
        store.close()
        if inputs is not None:
            inputs.close()
    console.print(f"stored {written} new results in {target} (group {group})", markup=False)


@click.command()
@bootstrap_option
@prefix_option
@click.option("--follow", is_flag=True, help="Keep waiting for new dead letters.")
@broker_kind_option
@security_options
def deadletters(
    bootstrap: str, prefix: str, follow: bool, broker_kind: str | None, security: KafkaSecurity
) -> None:
    """Print every dead letter (bad input the worker or an engine refused) with its reason,
    from the beginning (joining no consumer group), then a count per cause."""
    from relstream.client import RelstreamClient
    from relstream.kafka.inspect import DeadLetterCauses

    causes = DeadLetterCauses()
    try:
        with (
            stop_signals() as stop,
            RelstreamClient(bootstrap, prefix, security, broker_kind) as client,
        ):
            for letter in client.dead_letters(follow=follow, idle_seconds=0, stop=stop):
                causes.add(letter)
                cut = " (cut)" if letter.truncated else ""
                where = f"{letter.topic}[{letter.partition}]@{letter.offset}"
                console.print(
                    f"{where} {letter.original_size} bytes{cut}: {letter.reason}", markup=False
                )
    except KeyboardInterrupt:  # a second Ctrl-C: the count, then quiet
        pass
    console.print(f"{causes.total()} dead letters")
    for line in causes.lines():
        console.print(f"  {line}", markup=False)
