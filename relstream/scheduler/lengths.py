"""How long rows' outputs turn out, learned from the rows that finished: what a relQuery
none of whose rows has finished yet will take, for the deadline rule (`deadlines`).

Before a row of R finishes, its own rows say nothing of where their outputs end, and
counting each at its whole budget overestimates a relQuery whose answers are short (a
label against a budget of a paragraph). Rows with the same budget are taken as alike:
the engine keeps the outputs of the last `WINDOW` finished rows of each budget, and the
longest of m rows is expected at the sample's m/(m+1) quantile (the expected rank of
the largest of m draws), whatever the lengths' distribution.
"""

from __future__ import annotations

from collections import deque

from sortedcontainers import SortedList

WINDOW = 256  # finished rows remembered per output budget
MIN_ROWS = 8  # finished rows of a budget before their lengths are trusted


class OutputLengths:
    """The outputs of the last `WINDOW` finished rows of each output budget."""

    def __init__(self) -> None:
        self._recent: dict[int, deque[int]] = {}
        self._sorted: dict[int, SortedList] = {}

    def add(self, budget: int, generated: int) -> None:
        """A row with output budget `budget` finished after `generated` tokens."""
        recent = self._recent.setdefault(budget, deque())
        ordered = self._sorted.setdefault(budget, SortedList())
        recent.append(generated)
        ordered.add(generated)
        if len(recent) > WINDOW:
            ordered.remove(recent.popleft())

    def longest(self, budget: int, rows: int) -> int | None:
        """The output the longest of `rows` rows of this budget is expected to reach
        (None until `MIN_ROWS` of them finished)."""
        ordered = self._sorted.get(budget)
        if ordered is None or len(ordered) < MIN_ROWS:
            return None
        rank = len(ordered) * rows // (rows + 1)
        return min(ordered[min(rank, len(ordered) - 1)], budget)
