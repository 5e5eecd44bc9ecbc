"""What makes stored results joinable: the input values of each of a result's rows (from
its relQuery's rows, which `kafka.tools.inputs.RelQueryInputs` reads from the relqueries topic).
The query a result answers is its window id's (`wire.windowid.WindowId.query_of`)."""

from __future__ import annotations

from relstream.wire.messages import RelQueryRow


def input_values(rows: list[RelQueryRow] | None, index: int, key: str) -> dict | None:
    """The input values of a result's row `index` (keyed `key`), or None where the
    relQuery is unknown or its row there has another key."""
    if rows is None or index >= len(rows) or rows[index].key != key:
        return None
    return rows[index].values
