"""relstream's own policy: small batches while the stream can afford them, V1's when not.

A stream never ends, so a policy that finishes less work per second than stock vLLM V1
while the stream needs that work falls behind for good, whatever it gains by order; a
policy that keeps V1's full batches when the stream leaves capacity spare gives up the
latency that holding work back buys. Each step:

1. **Rank** relQueries by the remaining work they add to the engine, with the online
   step cost L = b + a_p·tokens + a_d·decodes (`stepcost`), aged by arrival:

       W(R) = a_p·P(R) + (a_d + b/n)·O(R)        rank(R) = arrival(R) + γ·W(R)

   P: prompt tokens still to compute, at the prefix cache's miss ratio on a sample of
   R's waiting rows (the paper's utok); O: output tokens still expected (`remaining`);
   n: requests in the running batch. Every step is shared by the n requests it runs, so
   each output token carries b/n of a step's base (PEM charges every relQuery OL(R)·b
   whole, as if it ran alone). Pricing cached prompts low also groups relQueries that
   share a template, which keeps it cached: fewer prompt tokens, more throughput. A
   relQuery that arrives Δ seconds after R goes ahead of R only if its work is smaller
   by more than Δ/γ (γ = `size_weight`, dimensionless: W is in engine seconds), so only
   what arrives within γ·W(R) of R can pass it: the rank ages, and no relQuery waits
   forever behind a stream of smaller ones.
2. **Bound the wait.** R's deadline is its arrival plus `fcfs_slack` times the latency
   FCFS would give it (the work of every unfinished relQuery ahead of it and its own,
   in engine seconds). Past it, R goes ahead of every relQuery that is not, earliest
   deadline first: a hard bound on any machine, with no per-machine threshold. A
   relQuery that can no longer meet the deadline its user set (`RelQueryInfo.deadline`)
   goes behind the others, so it does not push them past theirs (`deadlines`); without
   deadlines nothing changes.
3. **Shape the batch by the load** (`gate`, `headroom`). A waiting relQuery joins the
   running ones only when the paper's Δ (ABA, in V1's mixed steps) says admitting it now
   beats admitting it after them, counting among those it would delay by waiting both
   the relQueries queued behind it and the stream's pressure: how many relQueries a
   second of lost capacity delays: those arriving before today's backlog clears, at the
   measured load. While the backlog is short small batches finish the best-ranked
   relQueries sooner; as it grows or the engine nears full, the pressure grows without
   bound and every step is V1's full batch (`admission.StepAdmission`,
   the one admission every V1-style policy uses). Either way:
4. **Run** every running request in rank order; when KV runs out, the last row of the
   worst-ranked running relQuery is preempted by recompute (V1's priority victim).
5. **Admit** waiting requests in rank order (a started relQuery's remaining rows keep
   its rank) while they fit.

Classes lead every order (`classes`); with fair share on (`RelstreamConfig.fair_weights`)
the query served least goes first within a class, then this order (`fairshare`).

Which regime holds is a fact of the machine (the step-cost fit prices both sides) and of
the moment (the load). The benchmarks' references (the gate with no pressure, V1's
batches, a clairvoyant order, other exponents of the pressure) are the lab's subclasses
(`relstream_lab.policies`): each overrides one hook (`fill_step`, `pressure`, `oracle`).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace

from relstream.placement.load import Load, counted_load
from relstream.scheduler.admission import StepAdmission, Stop
from relstream.scheduler.classes import Slowdown, best_waiting, make_way, within_slowdown
from relstream.scheduler.data import RelQueryInfo, StepFeedback, StepPlan
from relstream.scheduler.deadlines import DeadlineWatch, lost_at
from relstream.scheduler.fairshare import FairQueue, FairShare, fair_key
from relstream.scheduler.gate import full_batch, gated_fill, sample
from relstream.scheduler.headroom import Headroom, StepWork
from relstream.scheduler.lengths import OutputLengths
from relstream.scheduler.paperlines import Coefficients, CostModel
from relstream.scheduler.policies import Policy, load_batch
from relstream.scheduler.ranking import RankedQueue, WorkRanking
from relstream.scheduler.remaining import Oracle, Remaining, RemainingBook, remaining
from relstream.scheduler.reserve import ReserveShare
from relstream.scheduler.starvation import StarvationGuard
from relstream.scheduler.stepcost import OnlineStepCost
from relstream.scheduler.steprecord import StepDecision
from relstream.scheduler.view import EngineView

# (class negated, Urgency, aged W or starvation deadline, arrival, id)
Rank = tuple[int, int, float, float, str]
REPRICE_PER_STEP = 4  # waiting relQueries re-priced and re-ranked each step, round robin
CONTEXT_SAMPLE = 64  # requests whose context prices a decode's attention
CACHE_SAMPLE = 4  # waiting rows of a relQuery probed for the prefix cache's miss ratio


@dataclass(frozen=True)
class RelstreamConfig:
    fcfs_slack: float = 16.0  # a relQuery's deadline: this times its FCFS latency (inf: none)
    # rank = arrival + size_weight × W (inf: W alone). Both chosen on the sustained
    # benchmark (docs/benchmarks/sustained/notes.md).
    size_weight: float = 64.0
    deadlines: bool = True  # honour the deadlines users set (False: a reference ignoring them)
    # Fair share between queries (`fairshare`): each query's weight (one not named: 1.0);
    # None: off.
    fair_weights: dict[str, float] | None = None


class Relstream(Policy):
    name = "relstream"
    # Rows' true remaining outputs: None here, every output estimated (`remaining`); the
    # lab's clairvoyant reference reads the simulator's.
    oracle: Oracle | None = None

    def __init__(self, cost: CostModel, config: RelstreamConfig | None = None) -> None:
        super().__init__(cost)
        self.config = config or RelstreamConfig()
        self.step_cost = OnlineStepCost.from_prior(cost)
        self.starvation = StarvationGuard()
        weights = self.config.fair_weights
        self.fair = FairShare(weights) if weights is not None else None
        # relQueries with no running request, by rank (fair share: by query, then rank)
        self._order = RankedQueue() if self.fair is None else FairQueue(self.fair)
        self._uncached: dict[str, Remaining] = {}  # remaining work, the cache aside
        self._left = RemainingBook()  # the same, prompts at the cache's miss ratio
        self._miss: dict[str, tuple[float, int]] = {}  # (miss ratio, waiting rows) last probed
        self._cycle: deque[str] = deque()  # ranked relQueries, the longest unpriced first
        self._cycling: set[str] = set()
        self.headroom = Headroom()
        self._size: dict[str, int] = {}  # rows of each unfinished relQuery
        self._planned = (0.0, 1, False, False)  # last plan: when, full batch, held, gated
        self.deadlines = DeadlineWatch()
        self.ranking = WorkRanking(self.starvation, self._left, self.config.size_weight)
        self._last: Coefficients | None = None  # the last step's prices
        self._lengths: OutputLengths | None = None  # the engine's finished rows' outputs
        self.reserve_share = ReserveShare()  # share of running rows' future KV kept

    def observe(self, feedback: StepFeedback) -> None:
        """Only the step cost learns: relstream reads no other cost model. The step's
        work at full-batch prices feeds the headroom."""
        self.step_cost.observe(feedback)
        at, batch, held, gated = self._planned
        base, per_token, per_decode, per_context = self.step_cost.coefficients()
        work = (
            per_token * feedback.uncached_tokens
            + (per_decode + base / batch) * feedback.decode_requests
            + per_context * feedback.context_tokens
        )
        step = StepWork(at + feedback.duration, work, feedback.duration, held, gated)
        self.headroom.executed(step)

    def cost_coefficients(self) -> dict[str, float]:
        base, per_token, per_decode, per_context = self.step_cost.coefficients()
        return {
            "base": base,
            "per_token": per_token,
            "per_decode": per_decode,
            "per_context": per_context,
        }

    def plan(self, view: EngineView) -> StepPlan:
        return self.plan_step(view)  # unfinished prompts continue inside the step itself

    def load(self, view: EngineView) -> Load:
        """As every policy's, from the book it keeps (prompts at the prefix cache's miss
        ratio) at the last step's prices, the fitted step cost's."""
        if self._last is None:  # no step planned yet: the cost model's prior prices
            return super().load(view)
        c = replace(self._last, batch=load_batch(view))
        relqueries = view.tracker.relqueries
        works = [(_class(relqueries.get(rid)), c.work(left)) for rid, left in self._left.items()]
        return counted_load(c.work(self._left.total()), c.per_token, c.per_output, works)

    def plan_step(self, view: EngineView) -> StepPlan:
        coefficients = self._last = self.ranking.prices = self._coefficients(view)
        self._refresh(view, coefficients)
        now = view.now()
        active = view.tracker.active_relqueries.values()
        if self.fair is not None:
            started = (info.query for info in active if info.waiting)
            self.fair.backlogged(itertools.chain(self._order.queries(), started))
        # Active relQueries changed this step, so _refresh has just estimated them afresh.
        ranks = ((self._rank(info, coefficients, now), info) for info in active)
        ranked = sorted(((fair_key(self.fair, r, info), info) for r, info in ranks), key=_first)
        plan = self.fill_step(view, ranked, coefficients)
        if self.fair is not None:
            self.fair.charge(view.tracker.unshared(plan), view.tracker)  # twins run once
        decision = self.decision or StepDecision()
        self._planned = (now, full_batch(view), decision.held, decision.gated)
        return plan

    def fill_step(
        self, view: EngineView, ranked: list[tuple[Rank, RelQueryInfo]], c: Coefficients
    ) -> StepPlan:
        """Decode every running request, then prompts and admissions through the Δ gate
        weighed by the pressure; KV is kept for what running requests will still
        generate. `ranked`: the running relQueries with their ranks, best first."""
        # Lower classes decode beside a higher one only within its slowdown, and a higher
        # class waiting takes their seats (`classes`); a step that would then run nothing
        # at all runs every class.
        waiting = best_waiting(heapq.merge(ranked, self.waiting_ranked(view), key=_first))
        budget = view.limits.max_num_batched_tokens
        slowdown = within_slowdown([info for _, info in ranked], c, budget, waiting)
        plan = self._compose(view, ranked, c, slowdown, waiting)
        if slowdown.decoding < len(ranked) and not (plan.prefill or plan.decode or plan.preempt):
            plan = self._compose(view, ranked, c, Slowdown(len(ranked)), waiting)
        return plan

    def _compose(
        self,
        view: EngineView,
        ranked: list[tuple[Rank, RelQueryInfo]],
        c: Coefficients,
        slowdown: Slowdown,
        waiting: RelQueryInfo | None,
    ) -> StepPlan:
        """The step with `slowdown.decoding` of `ranked` run; `waiting`: the best-ranked
        relQuery with waiting rows among all of them."""
        reserve = 1.0 if self.oracle is not None else self.reserve_share.value
        step = StepAdmission.for_step(
            view, budget=slowdown.budget, reserve=reserve, oracle=self.oracle
        )
        idle = ranked[slowdown.decoding :]
        ranked = ranked[: slowdown.decoding]
        active = [info for _, info in ranked]
        step.decode(active, [seq for _, info in idle for seq in info.running.values()])
        ran = bool(step.scheduled or step.preempted)  # running rows had their step
        short_of_kv = bool(step.preempted)
        if not short_of_kv:  # for one this step can admit: ranked to run, or waiting
            if idle:  # one of the relQueries not run is no candidate
                merged = heapq.merge(ranked, self.waiting_ranked(view), key=_first)
                waiting = best_waiting(merged)
            make_way(step, waiting)
        if step.preempted:
            for info in active:
                step.continue_prompts(info, slowdown.prompt_limit(info, c.per_token))
            self.decision = StepDecision(gated=True, stop=Stop.PREEMPTED)
        else:
            queued = len(self._order) + sum(1 for info in active if info.waiting)
            arriving = self.pressure(view, c)
            waiting = self.waiting_ranked(view)
            held = gated_fill(
                view, step, ranked, waiting, queued, self._left.__getitem__, c, arriving,
                slowdown,
            )  # fmt: skip
            self.decision = StepDecision(gated=True, held=held, pressure=arriving, stop=step.stop)
        if ran:  # the share learns from what KV preempted, prompts' room included
            self.reserve_share.stepped(short_of_kv)
        plan = step.plan()  # a cut budget goes with it, for vLLM to chunk to (`classes`)
        cut = slowdown.budget is not None and plan.prefill
        return replace(plan, budget=slowdown.budget) if cut else plan

    def pressure(self, view: EngineView, c: Coefficients) -> float:
        """Relqueries a lost second of capacity delays beyond those queued, at today's
        load and backlog (`headroom`)."""
        return self.headroom.pressure(view.now(), c.work(self._left.total()))

    def waiting_ranked(self, view: EngineView) -> Iterator[tuple[Rank, RelQueryInfo]]:
        """The relQueries with no running request, best rank first, with their ranks."""
        relqueries = view.tracker.relqueries
        return ((rank, relqueries[rank[-1]]) for rank in self._order)

    def _coefficients(self, view: EngineView) -> Coefficients:
        """The fitted step cost, a decode priced with attention over the running
        requests' mean context (their prompts' when nothing runs)."""
        tracker = view.tracker
        base, per_token, per_decode, per_context = self.step_cost.coefficients()
        rows = sample(tracker.running.values(), CONTEXT_SAMPLE)
        rows = rows or sample(tracker.waiting.values(), CONTEXT_SAMPLE)
        context = sum(seq.computed_tokens or seq.prompt_tokens for seq in rows)
        per_decode += per_context * context / max(len(rows), 1)
        return Coefficients(base, per_token, per_decode, max(len(tracker.running), 1))

    # ranking (`ranking.WorkRanking`) and the deadlines it reads
    def _needed(self, info: RelQueryInfo, c: Coefficients) -> float:
        """τ(R): its uncached prompt at the fitted price, then its decode steps left at
        a decode step's price for today's batch; until a row of R finishes, its steps are
        those the longest of its rows is expected to take (`deadlines`)."""
        left = self._left[info.relquery_id]
        steps = left.steps
        if not info.finished and self._lengths is not None:
            longest = self._lengths.longest(info.max_tokens, left.rows)
            steps = steps if longest is None else min(steps, longest)
        step = c.base + c.per_decode * c.batch
        return c.per_token * left.prompt_tokens + step * steps

    def _lost_at(self, info: RelQueryInfo, c: Coefficients) -> float | None:
        """When R can no longer meet its deadline (None: none, or not honoured)."""
        if info.deadline is None or not self.config.deadlines:
            return None
        return lost_at(info.deadline, self._needed(info, c))

    def _rank(self, info: RelQueryInfo, c: Coefficients, now: float) -> Rank:
        return self.ranking.rank(info, now, self._lost_at(info, c))

    def _rank_waiting(self, info: RelQueryInfo, c: Coefficients, now: float) -> Rank:
        """R's rank, and a look again when it may lose its deadline."""
        at = self._lost_at(info, c)
        if at is not None:
            self.deadlines.watch(info.relquery_id, at if at > now else None)
        return self.ranking.rank(info, now, at)

    def _refresh(self, view: EngineView, coefficients: Coefficients) -> None:
        """Re-estimate what changed; the rest keeps its rank (a fully waiting relQuery's
        remaining work does not change), re-ranked on fresh coefficients now and then."""
        tracker = view.tracker
        self._lengths = tracker.outputs
        # Sets are walked in sorted order: their own order follows string hashing, which
        # differs from run to run, and the arrival window and the cycle keep order.
        changed, gone = tracker.drain_changes()
        for relquery_id in sorted(rid for rid in gone if rid in self._left):  # finished
            self.headroom.finished(view.now(), self._size.pop(relquery_id))
            self._unrank(relquery_id)
            self.starvation.forget(relquery_id)
            self.deadlines.forget(relquery_id)
            del self._left[relquery_id]
            del self._uncached[relquery_id]
            self._miss.pop(relquery_id, None)
        newcomers = [tracker.relqueries[rid] for rid in sorted(changed) if rid not in self._left]
        for info in newcomers:
            self._size[info.relquery_id] = info.total_requests
            self.headroom.arrived(info.arrival_time, info.total_requests)
        for relquery_id in sorted(changed):
            self._uncached[relquery_id] = remaining(tracker.relqueries[relquery_id], self.oracle)
            self._left[relquery_id] = self._priced(view, tracker.relqueries[relquery_id])
        self._set_deadlines(newcomers, coefficients)
        now = view.now()
        changed |= self.starvation.newly_starving(now, tracker.relqueries)
        changed |= self.deadlines.due(now, tracker.relqueries)
        # The prefix cache and the coefficients move on: a few waiting relQueries are
        # re-priced (their cache probed afresh) and re-ranked each step, round robin, so
        # no step re-ranks them all.
        for rid in self._stale(REPRICE_PER_STEP, changed):
            self._left[rid] = self._priced(view, tracker.relqueries[rid], probe=True)
            changed.add(rid)
        for relquery_id in sorted(changed):
            self._unrank(relquery_id)
            info = tracker.relqueries[relquery_id]
            if not info.running:
                rank = self._rank_waiting(info, coefficients, now)
                self._order.put(relquery_id, rank, info.query)
                if relquery_id not in self._cycling:
                    self._cycling.add(relquery_id)
                    self._cycle.append(relquery_id)

    def _stale(self, count: int, skip: set[str]) -> list[str]:
        """Up to `count` ranked relQueries, those re-priced longest ago first."""
        picked: list[str] = []
        for _ in range(len(self._cycle)):
            if len(picked) == count:
                break
            rid = self._cycle.popleft()
            if rid not in self._order:  # started or finished: dropped from the cycle
                self._cycling.discard(rid)
                continue
            self._cycle.append(rid)
            if rid not in skip:
                picked.append(rid)
        return picked

    def _priced(self, view: EngineView, info: RelQueryInfo, probe: bool = False) -> Remaining:
        """R's remaining work, its prompts priced at the prefix cache's miss ratio on a
        sample of its waiting rows (the paper's utok): rows whose template or shared
        values are cached cost less, and ranking them first keeps them cached. The ratio
        is kept between samples: the cache is probed when asked (`probe`, the round
        robin), for a newcomer, and when R's waiting rows changed (its own rows started,
        caching their template), not each step R's running rows decode."""
        relquery_id = info.relquery_id
        left = self._uncached[relquery_id]
        kept = self._miss.get(relquery_id)
        if probe or kept is None or kept[1] != len(info.waiting):
            sample = list(itertools.islice(info.waiting.values(), CACHE_SAMPLE))
            tokens = sum(seq.uncomputed_tokens for seq in sample)
            cached = sum(view.cached_prompt_tokens(seq) for seq in sample) if tokens else 0
            kept = self._miss[relquery_id] = (
                1 - cached / tokens if tokens else 1.0,
                len(info.waiting),
            )
        if kept[0] == 1.0:
            return left
        return replace(left, prompt_tokens=round(left.prompt_tokens * kept[0]))

    def _set_deadlines(self, newcomers: list[RelQueryInfo], c: Coefficients) -> None:
        """Each newcomer's deadline: its arrival plus `fcfs_slack` times the latency FCFS
        would give it, the work of every unfinished relQuery that came before it and its
        own (engine seconds: a backlogged engine drains one per second)."""
        if not newcomers or math.isinf(self.config.fcfs_slack):
            return
        newcomers.sort(key=lambda info: info.arrival_time)
        fresh = {info.relquery_id for info in newcomers}
        ahead = c.work(self._left.total()) - sum(c.work(self._left[rid]) for rid in fresh)
        for info in newcomers:
            ahead += c.work(self._left[info.relquery_id])
            self.starvation.watch(
                info.relquery_id, info.arrival_time + self.config.fcfs_slack * ahead
            )

    def _unrank(self, relquery_id: str) -> None:
        self._order.drop(relquery_id)


def _class(info: RelQueryInfo | None) -> int:
    return 0 if info is None else info.priority


def _first(pair: tuple[Rank, RelQueryInfo]) -> Rank:
    return pair[0]
