"""Deadlines users set: a relQuery that can no longer meet its deadline goes behind the
others.

τ(R), the time R still needs if it went first, is its uncached prompt at the fitted
per-token price plus its decode steps left at the price of a decode step of the batch
running now (b + a_d·n): R's rows join that batch, and its last row ends after L(R) of
its steps. Until a row of R finishes, L(R) is what the longest of its rows is expected
to take, from finished rows of the same output budget (`lengths`). The engine's mean
step would count the prompt chunks of relQueries behind R, which serving R first does
not wait for: on the sustained benchmark it set aside relQueries the same policy blind
to deadlines met. R is **lost** once deadline − now < τ: even served first, it would
not make it.

A lost relQuery goes behind every relQuery that is not (size order within each group;
the starvation guard still bounds its wait). Serving it first cannot save it, and every
relQuery it passed would lose time it may need for its own deadline: the domino by
which earliest-deadline-first collapses under overload; Moore and Hodgson's rule for the
most jobs on time likewise serves short jobs first and sets aside those that cannot
finish. Earlier, coarser estimates of τ marked R lost at a share of it (0.5-0.85); with
this one the whole of τ met the most deadlines (docs/benchmarks/deadlines/notes.md).

Nothing is raised *ahead* of size order: on the sustained benchmark (deadlines of 3x each
relQuery's latency alone) ranking relQueries at risk first, least slack or least work
first, met fewer deadlines than size order alone in most cells (docs/benchmarks/
deadlines/notes.md). A deadline proportional to a relQuery's own size is what size order
already serves: the smallest relQueries, whose deadlines are tightest, go first.

The status changes with the clock alone, so `DeadlineWatch` keeps the time each waiting
relQuery becomes lost in a heap, and the policy re-ranks those due.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Container
from enum import IntEnum


class Urgency(IntEnum):
    """The first field of a relQuery's rank: lower goes first."""

    STARVING = 0  # past the starvation guard's deadline
    OTHER = 1  # size (aged) order
    LOST = 2  # can no longer meet the deadline its user set


def lost_at(deadline: float, needed: float) -> float:
    """When a relQuery needing `needed` seconds (τ) can no longer meet `deadline`."""
    return deadline - needed


class DeadlineWatch:
    """The next time each relQuery's deadline status may change, in a heap."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._next: dict[str, float] = {}

    def watch(self, relquery_id: str, at: float | None) -> None:
        """Look at R again at `at` (None: nothing to watch). An earlier time stands."""
        if at is None or not math.isfinite(at) or at >= self._next.get(relquery_id, math.inf):
            return
        self._next[relquery_id] = at
        heapq.heappush(self._heap, (at, relquery_id))

    def due(self, now: float, alive: Container[str]) -> set[str]:
        """relQueries, still unfinished, whose status may have changed by `now`."""
        due: set[str] = set()
        while self._heap and self._heap[0][0] <= now:
            at, relquery_id = heapq.heappop(self._heap)
            if self._next.get(relquery_id) != at:
                continue  # superseded by an earlier look
            del self._next[relquery_id]
            if relquery_id in alive:
                due.add(relquery_id)
        return due

    def forget(self, relquery_id: str) -> None:
        self._next.pop(relquery_id, None)
