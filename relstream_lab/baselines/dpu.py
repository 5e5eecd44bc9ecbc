"""Dynamic Priority Updater (paper §4.2).

Each iteration: Prio(R_t) = Prio(R_{t-1}) if every request of R was and still is
waiting, else PEM(R_t), with utok*(r) = tok(r) × cache_miss_ratio(R_t) (eq. cache_miss)
measured on a small random sample of R's waiting requests. Starvation guard: once
waiting_time(R) / req(R_0) exceeds the threshold, Prio(R) = 0.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from relstream.scheduler.data import RelQueryInfo
from relstream.scheduler.paperlines import CostModel
from relstream.scheduler.starvation import StarvationGuard, paper_deadline
from relstream.scheduler.view import EngineView
from relstream_lab.baselines.pem import pem

PriorityKey = tuple[float, float, str]  # (Prio, arrival, id): ties go to the older relQuery


@dataclass(frozen=True)
class DPUConfig:
    sample_size: int = 10  # waiting requests probed per relQuery for the miss ratio
    starvation_threshold: float = 10.0  # seconds of waiting per request of R_0
    seed: int = 0


class DynamicPriorityUpdater:
    def __init__(self, cost: CostModel, config: DPUConfig | None = None) -> None:
        self.cost = cost
        self.config = config or DPUConfig()
        self.priority: dict[str, float] = {}
        self._rng = random.Random(self.config.seed)
        self._waiting_heap: list[tuple[float, float, str, int]] = []
        self._stamp: dict[str, int] = {}
        self.starvation = StarvationGuard()
        self.recomputed_last_update = 0

    def key(self, info: RelQueryInfo) -> PriorityKey:
        return (self.priority[info.relquery_id], info.arrival_time, info.relquery_id)

    def update(self, view: EngineView) -> None:
        tracker = view.tracker
        self._forget_finished(tracker.relqueries)
        # Requests that moved, grew or finished change R_t; running relQueries change
        # every step. Everything else is fully waiting both now and before: reuse.
        recompute = tracker.drain_changed() | set(tracker.active_relqueries)
        recompute |= self.starvation.newly_starving(view.now(), tracker.relqueries)
        # sorted: set order differs between processes and would reseed the miss-ratio sampler
        for relquery_id in sorted(recompute):
            info = tracker.relqueries[relquery_id]
            self.starvation.watch(
                relquery_id, paper_deadline(info, self.config.starvation_threshold)
            )
            self.priority[relquery_id] = self._estimate(view, info)
            self._push_waiting(info)
        self.recomputed_last_update = len(recompute)

    def head(self, view: EngineView) -> RelQueryInfo | None:
        """The waiting relQuery with the lowest priority value."""
        relqueries = view.tracker.relqueries
        while self._waiting_heap:
            _, _, relquery_id, stamp = self._waiting_heap[0]
            info = relqueries.get(relquery_id)
            if info is not None and info.waiting and self._stamp.get(relquery_id) == stamp:
                return info
            heapq.heappop(self._waiting_heap)
        return None

    def cache_miss_ratio(self, view: EngineView, info: RelQueryInfo) -> float:
        """Eq. cache_miss: Σ utok(r) / Σ tok(r) over a random sample of waiting requests."""
        waiting = info.waiting
        if len(waiting) <= self.config.sample_size:
            sample = list(waiting.values())
        else:
            sample = self._rng.sample(list(waiting.values()), self.config.sample_size)
        total = sum(seq.prompt_tokens for seq in sample)
        if total == 0:
            return 1.0
        cached = sum(view.cached_prompt_tokens(seq) for seq in sample)
        return (total - cached) / total

    def _estimate(self, view: EngineView, info: RelQueryInfo) -> float:
        if self.starvation.is_starving(info.relquery_id) and info.waiting:
            return 0.0
        miss = self.cache_miss_ratio(view, info) if info.waiting else 1.0
        waiting_uncached = [seq.prompt_tokens * miss for seq in info.waiting.values()]
        return pem(waiting_uncached, info.max_tokens, view.limits, self.cost)

    def _push_waiting(self, info: RelQueryInfo) -> None:
        stamp = self._stamp.get(info.relquery_id, 0) + 1
        self._stamp[info.relquery_id] = stamp
        if info.waiting:
            entry = (self.priority[info.relquery_id], info.arrival_time, info.relquery_id, stamp)
            heapq.heappush(self._waiting_heap, entry)

    def _forget_finished(self, alive: dict[str, RelQueryInfo]) -> None:
        if len(self.priority) <= 2 * len(alive) + 64:
            return  # amortise: sweep only once the dead outnumber the living
        for relquery_id in [rq for rq in self.priority if rq not in alive]:
            self.priority.pop(relquery_id, None)
            self._stamp.pop(relquery_id, None)
            self.starvation.forget(relquery_id)
