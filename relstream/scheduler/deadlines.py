"""Deadlines users set: which relQueries are at risk of missing theirs, and when that
changes.

τ(R), the time R still needs if it went first, is its uncached prompt at the fitted
per-token price plus its decode steps left at the engine's recent step duration: R's
rows join the batch that runs now, so each of its steps lasts as long as that batch's
steps do, and its last row ends after L(R) of them. Its slack is deadline − now − τ.

- **At risk** once the slack is at most (`RISK_FACTOR` − 1)·τ, i.e. now + 2τ ≥ deadline.
  τ is an estimate (outputs expected from finished siblings, a step time that R's own
  rows lengthen, seats that free only as running rows end), so R is raised while as much
  time again as the estimate remains for its error; earlier, size order serves most
  relQueries in time anyway and raising R would only cost the mean.
- At risk, relQueries go ahead of all but starving ones (`starvation`), **least slack
  first**, and pass the Δ gate at once: holding one back is what makes it miss.
- **Unreachable** once the slack is negative: R can no longer finish in time even going
  first. It falls back to its size rank (and the starvation guard still bounds its
  wait). Going first would not save it, and every relQuery it passed would lose time it
  may need for its own deadline: the domino by which earliest-deadline-first collapses
  under overload. The slack is re-read whenever R's estimate changes, so a relQuery
  given up while the engine was crowded is raised again if a quieter batch brings it
  back within reach.

Status changes with the clock alone, so `DeadlineWatch` keeps the next time each waiting
relQuery's status may change (when it becomes at risk, when unreachable) in a heap; the
policy re-ranks those due.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Container
from enum import IntEnum

RISK_FACTOR = 2.0  # at risk once now + RISK_FACTOR·τ reaches the deadline
STEP_MEMORY = 32  # steps the recent step duration is averaged over (exponentially)


class Urgency(IntEnum):
    """The first field of a relQuery's rank: lower goes first."""

    STARVING = 0  # past the starvation guard's deadline
    AT_RISK = 1  # may miss the user's deadline unless served now
    OTHER = 2  # size (aged) order


def status(deadline: float | None, needed: float, now: float) -> Urgency:
    """AT_RISK while `deadline` is reachable (slack ≥ 0) but near (now + RISK_FACTOR ×
    `needed` ≥ deadline), else OTHER."""
    if deadline is None:
        return Urgency.OTHER
    slack = deadline - now - needed
    if 0 <= slack <= (RISK_FACTOR - 1) * needed:
        return Urgency.AT_RISK
    return Urgency.OTHER


def next_change(deadline: float, needed: float, now: float) -> float | None:
    """When the status of a relQuery needing `needed` seconds may next change, its
    estimate unchanged: when it becomes at risk, then when it becomes unreachable."""
    for at in (deadline - RISK_FACTOR * needed, deadline - needed):
        if at > now:
            return at
    return None


class StepTime:
    """The engine's recent step duration, averaged exponentially over `STEP_MEMORY`."""

    def __init__(self) -> None:
        self.mean: float | None = None

    def observe(self, duration: float) -> None:
        if self.mean is None:
            self.mean = duration
        else:
            self.mean += (duration - self.mean) / STEP_MEMORY

    def get(self, default: float) -> float:
        return default if self.mean is None else self.mean


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
