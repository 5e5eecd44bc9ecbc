"""`relstream results | sink | deadletters`: results out, from any Kafka cluster."""

from __future__ import annotations

import click

from relstream.cli.common import (
    bootstrap_option,
    broker_kind_option,
    console,
    prefix_option,
    security_options,
    show_logs,
    stop_signals,
)
from relstream.cli.show import print_result, print_skipped
from relstream.kafka.clients.security import KafkaSecurity
from relstream.kafka.clients.topics import Topics


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

    show_logs("relstream.client")  # an outage said, not waited through in silence
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
    from relstream.kafka.tools.inputs import RelQueryInputs

    group = group or default_group(target)
    inputs = None
    if with_input:
        inputs = RelQueryInputs(bootstrap, Topics(prefix).relqueries, security)
    try:
        store = open_sink(target, inputs.rows if inputs is not None else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
    except ConnectionError as exc:  # PostgreSQL not reached: one line naming it
        raise click.ClickException(str(exc)) from None
    from relstream.client import ResultsUnavailable

    show_logs("relstream.client")  # an outage said, not waited through in silence
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
    from relstream.kafka.tools.inspect import DeadLetterCauses

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
