"""Free fields laid out for shared prompt prefixes: the order of each row's `fields` in
a relQuery whose template is an instruction followed by them (`model.RelQuery`), the
greedy grouping of LLM-SQL's GGR within a bound on the work (`FIELD_LAYOUT_BUDGET`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class Row(Protocol):
    """What the layout reads of a row (`model.Row`): its values by column."""

    values: Mapping[str, Any]


# Value visits one relQuery's free field layout may spend (a group of m rows scored over
# k fields costs m x (k + 1)); past it the groups left keep the given field order. Its
# cost on this project's machines is in docs/architecture/engine.md ("Bounded work").
FIELD_LAYOUT_BUDGET = 1_000_000


def shared_first(
    rows: Sequence[Row], fields: Sequence[str], budget: int = FIELD_LAYOUT_BUDGET
) -> list[tuple[str, ...]]:
    """Each row's free fields, ordered so that rows share the longest prompt prefixes: the
    field whose repeated values would save the most prompt bytes leading (the sum over
    its values of (rows with it - 1) x its length) leads; the rows are grouped by its
    value and each group orders the remaining fields the same way; a field that saves
    nothing keeps the given order. The greedy grouping of LLM-SQL's GGR, per relQuery.

    Groups are laid out level by level within `budget` value visits; once a group would
    pass it, that group and every one after it keep the given order of their remaining
    fields. Every row's order is still all of `fields`, each once."""
    orders: list[tuple[str, ...]] = [tuple(fields)] * len(rows)
    queue: deque[tuple[list[int], tuple[str, ...], tuple[str, ...]]] = deque(
        [(list(range(len(rows))), tuple(fields), ())]
    )
    spent = 0
    while queue:
        members, rest, placed = queue.popleft()
        cost = len(members) * (len(rest) + 1)
        if spent + cost > budget:
            queue.appendleft((members, rest, placed))
            for members, rest, placed in queue:
                for i in members:
                    orders[i] = (*placed, *rest)
            break
        spent += cost
        queue.extend(_group(members, rows, rest, placed, orders))
    return orders


def _group(
    members: list[int],
    rows: Sequence[Row],
    fields: tuple[str, ...],
    placed: tuple[str, ...],
    orders: list[tuple[str, ...]],
) -> list[tuple[list[int], tuple[str, ...], tuple[str, ...]]]:
    """Lay out one group: its lead field and its subgroups to lay out next, or (a field
    that saves nothing, or one row) its rows' orders set here and no subgroup."""

    def saved(name: str) -> int:
        counts = Counter(str(rows[i].values.get(name, "")) for i in members)
        return sum((count - 1) * len(value) for value, count in counts.items())

    scores = {name: saved(name) for name in fields}
    lead = max(fields, key=lambda name: scores[name], default=None)
    if lead is None or scores[lead] == 0 or len(members) < 2:
        for i in members:
            orders[i] = (*placed, *fields)
        return []
    rest = tuple(name for name in fields if name != lead)
    groups: dict[str, list[int]] = {}
    for i in members:
        groups.setdefault(str(rows[i].values.get(lead, "")), []).append(i)
    return [(group, rest, (*placed, lead)) for group in groups.values()]
