"""Fair share between queries (an option, docs/priority.md): when several queries have
work waiting, each is served in proportion to its weight, by a virtual token counter
per query (VTC, Sheng et al., "Fairness in Serving Large Language Models", OSDI 2024).

A query is the registered query a relQuery is a window of (`RelQueryInfo.query`; '' for
relQueries sent directly, which share one counter). Its counter grows by the tokens
each step computes for it, prompt tokens and outputs alike (the unit `relstream usage`
bills), over its weight. Within a class, relQueries go in the order of their query's
counter, then their own rank (relstream's: remaining work, starvation, deadlines act
within a query): the query served least goes first. A query that had nothing waiting
and now has is lifted to the least counter of those waiting (VTC's lift), so time
spent idle is not banked as credit. Counters are read once a step (`FairShare.key`),
so one step may serve a query past another; the next steps even it out.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping

from relstream.scheduler.data import RelQueryInfo, StepPlan
from relstream.scheduler.ranking import Rank, RankedQueue
from relstream.scheduler.tracker import RequestTracker


class FairShare:
    """The counters and weights (a query not in `weights` weighs `default_weight`)."""

    def __init__(self, weights: Mapping[str, float] | None = None, default_weight: float = 1.0):
        weights = dict(weights or {})
        for query, weight in [*weights.items(), ("(default)", default_weight)]:
            if not weight > 0:
                raise ValueError(f"fair share: the weight of query {query!r} must be > 0")
        self.weights = weights
        self.default_weight = default_weight
        self.counters: dict[str, float] = {}
        self._backlogged: set[str] = set()

    def key(self, rank: Rank, query: str) -> Rank:
        """A fair rank: the class, the query's counter, then the relQuery's own rank."""
        return (rank[0], self.counters.get(query, 0.0), *rank[1:])

    def backlogged(self, queries: Iterable[str]) -> None:
        """The queries with waiting rows this step: those that had none are lifted to the
        least counter of those that had; counters of queries with neither work nor
        anything to lift are dropped, so the map holds the queries with work."""
        now = set(queries)
        kept = [self.counters.get(query, 0.0) for query in now & self._backlogged]
        floor = min(kept, default=None)
        if floor is not None:
            for query in now - self._backlogged:
                self.counters[query] = max(self.counters.get(query, 0.0), floor)
        # An idle query at or below the floor would be lifted anyway; with nothing that
        # waited before, no query was short of service: the idle ones' counters go.
        idle = [q for q, c in self.counters.items()
                if q not in now and (floor is None or c <= floor)]  # fmt: skip
        for query in idle:
            del self.counters[query]
        self._backlogged = now

    def charge(self, plan: StepPlan, tracker: RequestTracker) -> None:
        """Count the step's tokens to each request's query: a prompt chunk's tokens, and
        one a decode (a planned request is running, or waiting to be admitted)."""

        def query(request_id: str) -> str:
            seq = tracker.running.get(request_id) or tracker.waiting[request_id]
            return tracker.relqueries[seq.relquery_id].query

        for chunk in plan.prefill:
            self._add(query(chunk.request_id), chunk.num_tokens)
        for request_id in plan.decode:
            self._add(query(request_id), 1)

    def _add(self, query: str, tokens: int) -> None:
        weight = self.weights.get(query, self.default_weight)
        self.counters[query] = self.counters.get(query, 0.0) + tokens / weight


class FairQueue:
    """`RankedQueue`'s contract, one queue per query: iteration yields fair ranks
    (`FairShare.key`, the counters as they are when iteration starts), best first."""

    def __init__(self, share: FairShare) -> None:
        self.share = share
        self._queues: dict[str, RankedQueue] = {}
        self._query: dict[str, str] = {}

    def put(self, relquery_id: str, rank: Rank, query: str = "") -> None:
        self.drop(relquery_id)
        self._query[relquery_id] = query
        self._queues.setdefault(query, RankedQueue()).put(relquery_id, rank)

    def drop(self, relquery_id: str) -> None:
        query = self._query.pop(relquery_id, None)
        if query is not None:
            queue = self._queues[query]
            queue.drop(relquery_id)
            if not len(queue):
                del self._queues[query]

    def queries(self) -> Iterator[str]:
        """The queries with a relQuery queued."""
        return iter(self._queues)

    def __contains__(self, relquery_id: object) -> bool:
        return relquery_id in self._query

    def __len__(self) -> int:
        return len(self._query)

    def __iter__(self) -> Iterator[Rank]:
        return heapq.merge(*(self._keyed(query, queue) for query, queue in self._queues.items()))

    def _keyed(self, query: str, queue: RankedQueue) -> Iterator[Rank]:
        key = self.share.key
        return (key(rank, query) for rank in queue)


def fair_key(share: FairShare | None, rank: Rank, info: RelQueryInfo) -> Rank:
    """`rank` as the step orders it: fair (`FairShare.key`) with fair share on."""
    return rank if share is None else share.key(rank, info.query)
