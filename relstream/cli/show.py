"""How the read commands (`results`, `sink`) print: a result's rows by status, and a
record they could not read."""

from __future__ import annotations

from collections import Counter

from relstream.cli.common import console
from relstream.wire import ResultMessage


def print_skipped(offset: int, reason: str) -> None:
    """A record skipped as unreadable, in red, with why."""
    console.print(f"[red]skipped unreadable result at offset {offset}: {reason}[/]")


def print_result(result: ResultMessage, shown: int | None) -> None:
    """The relQuery, its rows by status, and `shown` rows (all when None), rows that did
    not answer first: a 50-row result's one error is never hidden behind its answers."""
    latency = result.latency
    parts = ""
    if latency is not None:
        parts = " ".join(
            f"{name} {getattr(latency, name):.2f}s"
            for name in ("queued", "waiting", "core", "tail", "total")
        )
    statuses = Counter(row.status for row in result.rows)
    counts = ", ".join(f"{status} {count}" for status, count in sorted(statuses.items()))
    console.print(
        f"[bold]{result.id}[/] {len(result.rows)} rows: {counts} ({result.policy}) {parts}",
        markup=True,
        highlight=False,
    )
    rows = sorted(result.rows, key=lambda row: row.status == "ok")  # stable: others first
    picked = rows if shown is None else rows[:shown]
    for row in picked:
        text = row.output if row.status == "ok" else f"{row.status}: {row.error}"
        console.print(f"  {row.key}: {text}", markup=False)
    if len(rows) > len(picked):
        console.print(f"  ... and {len(rows) - len(picked)} more rows (--all shows them)")
