"""The starvation guard: once R is past its deadline it goes ahead of every relQuery that
is not, so no relQuery waits forever behind a stream of smaller ones. The paper's (§4.2)
deadline is arrival + threshold × req(R_0) (`paper_deadline`); relstream sets its own."""

from __future__ import annotations

import heapq
from collections.abc import Container

from relstream.scheduler.data import RelQueryInfo


def paper_deadline(info: RelQueryInfo, threshold: float) -> float:
    """Arrival + `threshold` seconds of waiting per request of R_0 (paper §4.2)."""
    return info.arrival_time + threshold * info.total_requests


class StarvationGuard:
    """Deadlines of the relQueries seen, in a heap; those past theirs are starving."""

    def __init__(self) -> None:
        self._deadlines: list[tuple[float, str]] = []
        self._deadline: dict[str, float] = {}
        self._starving: set[str] = set()

    def watch(self, relquery_id: str, deadline: float) -> None:
        """Give R its deadline (the first one given stands)."""
        if relquery_id in self._deadline:
            return
        self._deadline[relquery_id] = deadline
        heapq.heappush(self._deadlines, (deadline, relquery_id))

    def deadline(self, relquery_id: str) -> float:
        return self._deadline[relquery_id]

    def newly_starving(self, now: float, alive: Container[str]) -> set[str]:
        """relQueries, still unfinished, whose deadline passed since the last call."""
        starved: set[str] = set()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, relquery_id = heapq.heappop(self._deadlines)
            if relquery_id in alive:
                self._starving.add(relquery_id)
                starved.add(relquery_id)
        return starved

    def is_starving(self, relquery_id: str) -> bool:
        return relquery_id in self._starving

    def forget(self, relquery_id: str) -> None:
        """R finished: drop it (its deadline, if still queued, is skipped when due)."""
        self._deadline.pop(relquery_id, None)
        self._starving.discard(relquery_id)
