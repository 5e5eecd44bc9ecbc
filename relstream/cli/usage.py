"""`relstream usage`: what each query cost over a period, from the metrics topic."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime

import click
from rich.table import Table

from relstream.cli.common import bootstrap_option, console, prefix_option, security_options
from relstream.kafka.clients.security import KafkaSecurity

_SPAN = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def moment(text: str, now: float) -> float:
    """Seconds since the epoch of `text`: an age (`90s`, `30m`, `24h`, `7d`: that long
    before now) or an ISO 8601 time (`2026-11-29T10:00`, local time unless it says)."""
    span = _SPAN.fullmatch(text.strip())
    if span:
        return now - float(span[1]) * _UNIT_S[span[2]]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is neither an age (90s, 30m, 24h, 7d) nor an ISO time (2026-11-29T10:00)"
        ) from None


@click.command()
@bootstrap_option
@prefix_option
@click.option(
    "--since", default="24h", show_default=True,
    help="Start of the period: an age (30m, 24h, 7d) or an ISO time.",
)  # fmt: skip
@click.option("--until", default=None, help="End of the period (default: now); as --since.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per query, then the total.")
@security_options
def usage(
    bootstrap: str, prefix: str, since: str, until: str | None, as_json: bool,
    security: KafkaSecurity,
) -> None:  # fmt: skip
    """Tokens, rows and relQueries of each query answered in a period: prompt tokens (and
    the share vLLM's prefix cache held), output tokens, rows the answer cache answered.
    Read from the metrics topic (kept a day by default), joining no consumer group."""
    from relstream.kafka.clients.topics import Topics
    from relstream.kafka.tools.usage import usage_by_query

    now = time.time()
    start = moment(since, now)
    end = now if until is None else moment(until, now)
    if end <= start:
        raise click.BadParameter(f"the period ends ({until}) before it starts ({since})")
    with console.status("reading the metrics topic") as status:
        report = usage_by_query(
            bootstrap, Topics(prefix), start, end, security,
            progress=lambda n: status.update(f"reading the metrics topic: {n:,} records"),
        )  # fmt: skip
    rows = [*sorted(report.queries.values(), key=lambda q: -q.prompt_tokens), report.total()]
    if as_json:
        for row in rows:
            click.echo(json.dumps({**vars(row), "prefix_cached_share": row.prefix_cached_share}))
    else:
        show(report, rows)
    if report.unread:
        console.print(f"[yellow]not read to their end: {', '.join(report.unread)}[/]")


def show(report, rows) -> None:
    period = f"{_when(report.since)} to {_when(report.until)}"
    table = Table(
        "query", "relQueries", "rows", "prompt tokens", "prefix-cached", "output tokens",
        "answer-cached rows", title=f"usage, {period}",
        caption="tokens the engines computed; rows answered from the answer cache or by an "
        "identical row cost none (docs/usage.md)",
    )  # fmt: skip
    for row in rows:
        table.add_row(
            row.query, f"{row.relqueries:,}", f"{row.rows:,}", f"{row.prompt_tokens:,}",
            f"{row.prefix_cached_share:.0%}", f"{row.output_tokens:,}",
            f"{row.answer_cached_rows:,} ({row.answer_cached_share:.0%})",
            end_section=row is rows[-2] if len(rows) > 1 else False,
        )  # fmt: skip
    console.print(table)
    uncounted = rows[-1].uncounted
    if uncounted:
        console.print(
            f"{uncounted} of the relQueries came from engines that count no prompt tokens "
            "(a release before usage)"
        )


def _when(at: float) -> str:
    return datetime.fromtimestamp(at).isoformat(timespec="seconds")
