"""Who goes first, apart from how much goes in (SGLang's `calc_priority` beside its
admission): each policy names its order as a `Ranking`, an object whose `rank` gives a
relQuery's rank (`StaticRanking`: the paper's static priority; `WorkRanking`: relstream's
aged remaining work), and admission only walks it.

A rank is a tuple, smaller first, that begins with the relQuery's class negated (a
higher `priority` first, `classes`) and ends with its id, so ranks are distinct and
totally ordered, and every order holds within a class. `RankedQueue` keeps relQueries
in rank order and moves only those re-ranked, so a step costs what changed, not what
waits.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from sortedcontainers import SortedList

from relstream.scheduler.data import RelQueryInfo
from relstream.scheduler.deadlines import Urgency
from relstream.scheduler.paperlines import Coefficients
from relstream.scheduler.remaining import Remaining
from relstream.scheduler.starvation import StarvationGuard

Rank = tuple  # smaller first; the last item is the relQuery id


class Ranking(Protocol):
    def rank(self, info: RelQueryInfo, now: float) -> Rank: ...


def static_priority(prompt_tokens: int, requests: int, max_tokens: int) -> int:
    """Prio(R) = Σ_{r∈R} tok(r) + OL(r): the relQuery's prompt tokens plus its output
    budget, smaller first (the paper's vLLM-SP)."""
    return prompt_tokens + requests * max_tokens


# vLLM's priority queue orders by one integer: a class takes this span of it, so every
# request of a higher class comes before any of a lower one (a static priority of
# prompt and output tokens stays below 2**40 for any relQuery the wire admits).
CLASS_SPAN = 2**40


def vllm_priority(priority: int, static: int) -> int:
    """The integer vLLM's priority queue orders by (smaller first) for a request of
    class `priority` (higher first) and static priority `static`."""
    return static - priority * CLASS_SPAN


class StaticRanking:
    """The paper's static priority, then arrival: the order of vLLM-SP and of stock V1's
    priority queue fed relstream's submitted priorities."""

    def rank(self, info: RelQueryInfo, now: float) -> Rank:
        priority = static_priority(info.prompt_tokens_seen, info.total_requests, info.max_tokens)
        return (-info.priority, priority, info.arrival_time, info.relquery_id)


@dataclass
class WorkRanking:
    """relstream's order: rank(R) = arrival + γ·W(R), W its remaining work at the step's
    `prices` (engine seconds; γ = `size_weight`, inf: W alone). Past its starvation
    deadline R goes ahead of every relQuery that is not, earliest deadline first; once
    it can no longer meet the deadline its user set (`lost`, given by the caller, which
    prices the deadline: `deadlines.lost_at`), behind those that can. Ranks are (class
    negated, Urgency, aged W or starvation deadline, arrival, id): starvation and
    deadlines act within a class."""

    starvation: StarvationGuard
    left: Mapping[str, Remaining]  # each relQuery's last estimate of remaining work
    size_weight: float
    prices: Coefficients | None = None  # this step's, set before ranking

    def rank(self, info: RelQueryInfo, now: float, lost: float | None = None) -> Rank:
        """R's rank at `now`; `lost`: when R can no longer meet its deadline (None: it
        has none, or deadlines are not honoured)."""
        relquery_id = info.relquery_id
        if self.starvation.is_starving(relquery_id):
            deadline = self.starvation.deadline(relquery_id)
            return (-info.priority, Urgency.STARVING, deadline, info.arrival_time, relquery_id)
        c = self.prices
        assert c is not None, "prices are set each step before ranking"
        urgency = Urgency.OTHER
        if lost is not None and now >= lost:
            urgency = Urgency.LOST
        work = c.work(self.left[relquery_id])
        if not math.isinf(self.size_weight):
            work = info.arrival_time + self.size_weight * work
        return (-info.priority, urgency, work, info.arrival_time, relquery_id)


class RankedQueue:
    """RelQuery ids in rank order. `put` (re)ranks one, `drop` forgets it; iteration
    yields ranks, best first (a rank's last item is its id)."""

    def __init__(self) -> None:
        self._ranks: dict[str, Rank] = {}
        self._order = SortedList()

    def put(self, relquery_id: str, rank: Rank, query: str = "") -> None:
        """(Re)rank one; `query` is for `fairshare.FairQueue`'s sake (one queue here)."""
        self.drop(relquery_id)
        self._ranks[relquery_id] = rank
        self._order.add(rank)

    def drop(self, relquery_id: str) -> None:
        rank = self._ranks.pop(relquery_id, None)
        if rank is not None:
            self._order.remove(rank)

    def rank_of(self, relquery_id: str) -> Rank | None:
        return self._ranks.get(relquery_id)

    def __contains__(self, relquery_id: object) -> bool:
        return relquery_id in self._ranks

    def __len__(self) -> int:
        return len(self._ranks)

    def __iter__(self) -> Iterator[Rank]:
        return iter(self._order)
