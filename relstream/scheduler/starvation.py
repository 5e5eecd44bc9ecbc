"""The starvation guard (paper §4.2): once waiting_time(R) / req(R_0) exceeds a threshold,
R goes ahead of every relQuery that is not starving, so no relQuery waits forever
behind a stream of smaller ones."""

from __future__ import annotations

import heapq
from collections.abc import Container

from relstream.scheduler.view import RelQueryInfo


class StarvationGuard:
    """Deadlines of the relQueries seen, in a heap; those past theirs are starving."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold  # seconds of waiting per request of R_0
        self._deadlines: list[tuple[float, str]] = []
        self._watched: set[str] = set()
        self._starving: set[str] = set()

    def watch(self, info: RelQueryInfo) -> None:
        """Start R's clock at its arrival (once)."""
        if info.relquery_id in self._watched:
            return
        self._watched.add(info.relquery_id)
        deadline = info.arrival_time + self.threshold * info.total_requests
        heapq.heappush(self._deadlines, (deadline, info.relquery_id))

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
        self._watched.discard(relquery_id)
        self._starving.discard(relquery_id)
