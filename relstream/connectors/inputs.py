"""What makes stored results joinable: the query a result answers (from its window's id)
and the input values of each of its rows (from its relQuery's rows, which
`kafka.inputs.RelQueryInputs` reads from the relqueries topic)."""

from __future__ import annotations

import re

from relstream.wire.messages import RelQueryRow

# A window's relQuery id: `<query>-<partition>-<first offset>@<ms>` (`stream.windowing`),
# or `<query>-<partition>-<first offset>` from earlier releases.
_WINDOW_ID = re.compile(r"^(?P<query>.+)-\d+-\d+(?:@\d+)?$")


def query_of(relquery_id: str) -> str | None:
    """The registered query whose window `relquery_id` is; None for any other id (a
    relQuery a client submitted itself)."""
    match = _WINDOW_ID.match(relquery_id)
    return match["query"] if match else None


def input_values(rows: list[RelQueryRow] | None, index: int, key: str) -> dict | None:
    """The input values of a result's row `index` (keyed `key`), or None where the
    relQuery is unknown or its row there has another key."""
    if rows is None or index >= len(rows) or rows[index].key != key:
        return None
    return rows[index].values
