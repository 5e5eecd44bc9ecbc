"""`relstream results | sink | deadletters`: results out, from any Kafka cluster."""

from __future__ import annotations

import contextlib
import difflib

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
from relstream.wire.windowid import WindowId


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
    chosen = Chosen(queries, ids)
    try:
        with (
            stop_signals() as stop,
            RelstreamClient(bootstrap, prefix, security, broker_kind) as client,
        ):
            topic = client.topics.results

            def caught_up() -> None:  # following: a name that matched nothing is said now
                for line in chosen.missing(topic):
                    console.print(f"{line}; waiting for new results", markup=False)

            results = client.results(
                follow=follow,
                idle_seconds=0,
                on_unreadable=print_skipped,
                stop=stop,
                on_caught_up=caught_up if follow else lambda: None,
            )
            for result in results:
                if chosen(result.id):
                    print_result(result, None if every_row else SHOWN_ROWS)
            interrupted = stop()
    except KeyboardInterrupt:  # a second Ctrl-C (`stop_signals`): no "Aborted!"
        return
    missing = chosen.missing(topic)
    if missing and not follow and not interrupted:  # read to the end: none there
        raise click.ClickException("\n".join(missing))


SHOWN_ROWS = 3  # rows `results` prints of each relQuery unless --all


class Chosen:
    """Which relQueries `results --query/--id` asked for (all when neither is given): a
    window's query read from its id (`WindowId.query_of`), never by prefix, so `review`
    is not `review-sentiment`. It keeps the query names met, to say of one that matched
    nothing which exist, and the nearest (a typo)."""

    def __init__(self, queries: tuple[str, ...], ids: tuple[str, ...]) -> None:
        self.queries, self.ids = set(queries), set(ids)
        self.met: set[str] = set()  # query names of the results read (few: one a query)
        self.found: set[str] = set()  # the asked ids met

    def __call__(self, relquery_id: str) -> bool:
        query = WindowId.query_of(relquery_id)
        if query is not None:
            self.met.add(query)
        if relquery_id in self.ids:
            self.found.add(relquery_id)
        if not self.queries and not self.ids:
            return True
        return relquery_id in self.ids or query in self.queries

    def missing(self, topic: str) -> list[str]:
        """One line for each asked query or id no result had."""
        known = sorted(self.met)
        listed = ", ".join(known[:MET_SHOWN]) + (", ..." if len(known) > MET_SHOWN else "")
        there = f"; queries with results there: {listed}" if known else "; it holds none"
        lines = []
        for query in sorted(self.queries - self.met):
            near = difflib.get_close_matches(query, known, n=1, cutoff=0.6)
            hint = f" (did you mean --query {near[0]}?)" if near else ""
            lines.append(f"no result of query {query!r} on {topic}{hint}{there}")
        for relquery_id in sorted(self.ids - self.found):
            lines.append(f"no result with id {relquery_id!r} on {topic}")
        return lines


MET_SHOWN = 10  # query names listed where an asked one matched nothing


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
    except OSError as exc:  # a folder it may not write in, a full disk: nothing read
        raise click.ClickException(f"cannot store results in {target} ({exc}); 0 stored, "
                                   "none read") from None  # fmt: skip
    from relstream.client import ResultsUnavailable

    show_logs("relstream.client")  # an outage said, not waited through in silence
    written = kept = 0  # results written, and of those made durable (committed after)

    def sync() -> None:
        nonlocal kept
        store.sync()
        kept = written

    try:
        with (
            stop_signals() as stop,
            RelstreamClient(bootstrap, prefix, security, broker_kind) as client,
        ):
            # The client commits a batch only once every result in it is stored and
            # made durable (`store.sync`): a crash or a full disk loses nothing.
            results = client.results(
                group, follow, on_unreadable=print_skipped, stop=stop, before_commit=sync
            )
            # Closed here, not at exit: its consumer leaves the group before the process
            # ends (left to the interpreter's exit, its close hung a failed sink).
            with contextlib.closing(results):
                try:
                    for result in results:
                        written += bool(store.write(result))
                except OSError as exc:  # a full disk: what was not stored stays unread
                    raise click.ClickException(
                        f"could not store results in {target} ({exc}): {kept} new results "
                        "stored; none after them (those written since were cut from the "
                        f"file), and group {group!r} has not moved past them: run again "
                        "once there is room"
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
@click.option(
    "--waiting", is_flag=True,
    help="Only the letters `relstream replay` has not sent back (those it did are marked).",
)  # fmt: skip
@broker_kind_option
@security_options
def deadletters(
    bootstrap: str,
    prefix: str,
    follow: bool,
    waiting: bool,
    broker_kind: str | None,
    security: KafkaSecurity,
) -> None:
    """Print every dead letter (bad input the worker or an engine refused) with its reason,
    from the beginning (joining no consumer group), each one `relstream replay` sent back
    marked with when, then a count per cause."""
    from datetime import datetime

    from relstream.client import RelstreamClient
    from relstream.kafka.tools.inspect import DeadLetterCauses
    from relstream.kafka.tools.replay import replayed_at
    from relstream.wire.letters import letter_ref

    causes = DeadLetterCauses()
    replayed = 0  # letters shown (or, with --waiting, passed over) as sent back
    try:
        with (
            stop_signals() as stop,
            RelstreamClient(bootstrap, prefix, security, broker_kind) as client,
        ):
            sent_back = replayed_at(client.replay_marks(stop=stop))  # read first: marks follow
            for letter in client.dead_letters(follow=follow, idle_seconds=0, stop=stop):
                when = sent_back.get(letter_ref(letter))
                replayed += when is not None
                if waiting and when is not None:
                    continue
                causes.add(letter)
                cut = " (cut)" if letter.truncated else ""
                where = f"{letter.topic}[{letter.partition}]@{letter.offset}"
                back = ""
                if when is not None:
                    back = f" [replayed {datetime.fromtimestamp(when):%Y-%m-%d %H:%M:%S}]"
                console.print(
                    f"{where} {letter.original_size} bytes{cut}{back}: {letter.reason}",
                    markup=False,
                )
    except KeyboardInterrupt:  # a second Ctrl-C: the count, then quiet
        pass
    if waiting:
        console.print(f"{causes.total()} dead letters waiting ({replayed} replayed not shown)")
    else:
        back = f" ({replayed} of them replayed)" if replayed else ""
        console.print(f"{causes.total()} dead letters{back}")
    for line in causes.lines():
        console.print(f"  {line}", markup=False)
