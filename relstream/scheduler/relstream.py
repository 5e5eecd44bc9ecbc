"""relstream's own policy: RelServe's ordering, fitted to an engine that mixes steps.

Each step, with the online step cost L = b + a_p·tokens + a_d·decodes (`stepcost`):

1. **Order.** relQueries are ranked by the remaining work they add to the engine:

       W(R) = a_p·P(R) + (a_d + b/n)·O(R)

   P: prompt tokens still to compute; O: output tokens still expected (`remaining`);
   n: requests in the running batch. The step base b is shared by the n requests of a
   step, so each output token carries b/n of it, not b (PEM charges every relQuery
   OL(R)·b whole, as if it ran alone). A relQuery waiting longer than the paper's
   starvation threshold (seconds per request of R_0) goes first.
2. **Decode.** Every running request decodes, mixed with prompt chunks in one step as
   vLLM V1 does.
3. **Prompts and admission** (admission only in a step that preempted nothing), one
   rank order over started and waiting relQueries alike, while seats, token budget and
   KV last: a relQuery ranked ahead of one still computing its prompts gets its own
   computed first. A started relQuery ranked after relQueries that decode in this step
   adds prompt tokens only up to b·(1 + queued behind it) / (a_p·those decoding ahead):
   past that, what its prompt delays them outweighs the step base it saves (on this CPU
   a 2,048-token chunk stretches a 20 ms decode step past 2 s; where batching is free
   there is no limit). vLLM computes running prompts before it admits anyone, so a
   running prompt ranked after this step's admissions continues only where it fits
   whole. KV is
   counted for each request's whole sequence plus its expected output (and kept for the
   running requests' prompts and expected outputs), so admission does not thrash. Once
   a relQuery is held back, nobody ranked after it is admitted. A relQuery already
   started passes, and one with less work left than every running relQuery is admitted
   at once (shortest first: the paper's m+ > m-); any other is admitted only when the Δ
   of doing so now, rather than after the running set S, is negative:

       Δ+ = |S|·a_p·P(p) + a_d·m(p)·Σ_{R∈S} min(L(p), L(R))     delay it puts on S
       Δ- = T(S) − a_d·Σ_{R∈S} min(O(R), m(R)·L(p))              what p saves itself
            + |Q|·b·min(L(p), max L(S))                          saved steps, for the queue

   with m: rows, L: decode steps left, T(S) = a_p·ΣP + b·max L + a_d·ΣO the time S would
   still take alone, Q the relQueries ranked after p. On a base-bound engine (GPU) the
   queue's saved steps dominate and batches fill; on a per-request-bound one (this CPU)
   the delay to S does, and the running set stays small. The regime comes from the
   fitted coefficients; there is no per-machine knob.
4. **Preempt** only when a running request's next tokens find no KV: the last row of the
   worst-ranked running relQuery, by recompute, as vLLM would.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, replace

from relstream.scheduler.composer import StepComposer
from relstream.scheduler.cost import CostModel
from relstream.scheduler.policies import Policy
from relstream.scheduler.remaining import Oracle, Remaining, remaining
from relstream.scheduler.stepcost import OnlineStepCost
from relstream.scheduler.view import EngineView, RelQueryInfo, StepFeedback, StepPlan

Rank = tuple[int, float, float, str]  # (0 when starving else 1, W, arrival, id)
RESORT_EVERY = 64  # steps between re-ranking every waiting relQuery on fresh coefficients


@dataclass(frozen=True)
class RelstreamConfig:
    starvation_threshold: float = 10.0  # seconds of waiting per request of R_0
    reserve_outputs: float = 1.0  # share of expected output KV kept free at admission
    gate: bool = True  # admit the next relQuery only when Δ < 0


@dataclass(frozen=True)
class Coefficients:
    base: float
    per_token: float
    per_decode: float
    batch: int  # requests running now (at least 1)
    batching_free: bool = False  # the regime (`batching_is_free`)

    def work(self, left: Remaining) -> float:
        """W(R): the engine time R adds. Where batching is free, steps are shared by the
        whole batch and each output token carries b/n of a step's base; otherwise R, held
        mostly apart by the Δ gate, pays the base of each of its own L(R) steps."""
        prompt = self.per_token * left.prompt_tokens
        if self.batching_free:
            return prompt + (self.per_decode + self.base / self.batch) * left.output_tokens
        return prompt + self.base * left.steps + self.per_decode * left.output_tokens


class Relstream(Policy):
    name = "relstream"

    def __init__(
        self, cost: CostModel, config: RelstreamConfig | None = None, oracle: Oracle | None = None
    ) -> None:
        super().__init__(cost)
        self.config = config or RelstreamConfig()
        self.step_cost = OnlineStepCost.from_prior(cost)
        self.oracle = oracle
        self._rank: dict[str, Rank] = {}  # relQueries with no running request
        self._order: list[Rank] = []  # the same, sorted
        self._left: dict[str, Remaining] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._starving: set[str] = set()
        self._steps = 0

    def observe(self, feedback: StepFeedback) -> None:
        super().observe(feedback)
        self.step_cost.observe(feedback)

    def plan(self, view: EngineView) -> StepPlan:
        return self.plan_step(view)  # unfinished prompts continue inside the step itself

    def plan_step(self, view: EngineView) -> StepPlan:
        tracker = view.tracker
        base, per_token, per_decode, per_context = self.step_cost.coefficients()
        # A decode costs its own share plus attention over its context: priced at the
        # running requests' mean context (their prompts' when nothing runs).
        rows = list(tracker.running.values())[:64] or list(tracker.waiting.values())[:64]
        context = sum(seq.computed_tokens or seq.prompt_tokens for seq in rows) / max(len(rows), 1)
        per_decode += per_context * context
        coefficients = Coefficients(base, per_token, per_decode, max(len(tracker.running), 1))
        free = batching_is_free(view, coefficients)
        coefficients = replace(coefficients, batching_free=free)
        self._refresh(view, coefficients)
        # Active relQueries changed this step, so _refresh has just estimated them afresh.
        active = sorted(
            tracker.active_relqueries.values(),
            key=lambda info: self._ranked(info, coefficients),
        )
        step = StepComposer(view, self.oracle, self.config.reserve_outputs)
        step.decode(active)
        if step.preempted:
            for info in active:
                step.continue_prompts(info)
        else:
            self._fill(view, step, active, coefficients, self.config.gate and not free)
        return step.plan()

    # ranking
    def _rank_of(self, info: RelQueryInfo, coefficients: Coefficients) -> Rank:
        self._left[info.relquery_id] = remaining(info, self.oracle)
        return self._ranked(info, coefficients)

    def _ranked(self, info: RelQueryInfo, coefficients: Coefficients) -> Rank:
        """The rank of R from its last estimate of remaining work."""
        starving = 0 if info.relquery_id in self._starving else 1
        work = coefficients.work(self._left[info.relquery_id])
        return (starving, work, info.arrival_time, info.relquery_id)

    def _refresh(self, view: EngineView, coefficients: Coefficients) -> None:
        """Re-rank what changed; the rest keeps its rank (a fully waiting relQuery's
        remaining work does not change), re-ranked on fresh coefficients now and then."""
        tracker = view.tracker
        changed = tracker.drain_changed()
        now = view.now()
        while self._deadlines and self._deadlines[0][0] <= now:
            _, relquery_id = heapq.heappop(self._deadlines)
            if relquery_id in tracker.relqueries:
                self._starving.add(relquery_id)
                changed.add(relquery_id)
        self._steps += 1
        if self._steps % RESORT_EVERY == 0:
            # Fully waiting relQueries did not change: only the coefficients did.
            unchanged = [rid for rid in self._rank if rid not in changed]
            self._rank.update(
                (rid, self._ranked(tracker.relqueries[rid], coefficients)) for rid in unchanged
            )
            self._order = sorted(self._rank.values())
        for relquery_id in changed | (self._rank.keys() - tracker.relqueries.keys()):
            self._unrank(relquery_id)
            info = tracker.relqueries.get(relquery_id)
            if info is None:
                self._starving.discard(relquery_id)
                self._left.pop(relquery_id, None)
                continue
            if relquery_id not in self._left:
                deadline = info.arrival_time + self.config.starvation_threshold * (
                    info.total_requests
                )
                heapq.heappush(self._deadlines, (deadline, relquery_id))
            rank = self._rank_of(info, coefficients)
            if not info.running:
                self._rank[relquery_id] = rank
                bisect.insort(self._order, rank)

    def _unrank(self, relquery_id: str) -> None:
        rank = self._rank.pop(relquery_id, None)
        if rank is not None:
            del self._order[bisect.bisect_left(self._order, rank)]

    # prompts and admission, in rank order
    def _fill(
        self,
        view: EngineView,
        step: StepComposer,
        active: list[RelQueryInfo],
        coefficients: Coefficients,
        gate: bool,
    ) -> None:
        """Give the step's prompt budget in rank order over started and waiting
        relQueries alike: a relQuery ranked ahead of one still computing its prompts gets
        its own computed first. Started relQueries pass the Δ gate; once a relQuery is
        held back (by Δ, seats, budget or KV) nobody ranked after it is admitted, though
        prompts already running continue."""
        relqueries = view.tracker.relqueries
        started = [(self._ranked(info, coefficients), info) for info in active]
        waiting = ((rank, relqueries[rank[3]]) for rank in self._order)
        running_set = [self._left[info.relquery_id] for info in active]
        best_running = min((coefficients.work(left) for left in running_set), default=0.0)
        queued = len(self._order) + sum(1 for info in active if info.waiting)
        started_left = len(started)
        admitting = True
        decoding_ahead = 0  # relQueries ranked ahead whose rows decode in this step
        for position, (_, info) in enumerate(heapq.merge(started, waiting, key=_first)):
            behind = queued - position - 1
            limit = prompt_allowance(decoding_ahead, max(behind, 0), coefficients)
            if info.running:
                started_left -= 1
                step.continue_prompts(info, limit)
                decoding_ahead += any(seq.prefill_done for seq in info.running.values())
            if not admitting:
                if started_left == 0:
                    return
                continue
            if not info.waiting or step.preempted:
                continue
            left = self._left[info.relquery_id]
            # Less work left than every running relQuery: shortest first, as ABA's m+ > m-.
            shortest = coefficients.work(left) < best_running
            if info.running:
                admitting = step.admit(info, limit)
            elif shortest or not gate:
                admitting = step.admit(info)
            else:
                admitting = admission_pays(running_set, left, behind, coefficients)
                admitting = admitting and step.admit(info)
            running_set.append(left)


def prompt_allowance(decoding_ahead: int, behind: int, c: Coefficients) -> int | None:
    """How many prompt tokens of a started relQuery may join a step in which
    `decoding_ahead` better-ranked relQueries decode (None: no limit). Each token delays
    each of them by a_p; deferring the prompt costs a step's base b to it and the
    `behind` relQueries queued after it, so the allowance is b·(1 + behind) / (a_p·k).
    On this CPU a 2,048-token chunk would stretch a 20 ms decode step past 2 s."""
    if decoding_ahead == 0 or c.batching_free or c.per_token <= 0:
        return None
    return int(c.base * (1 + behind) / (c.per_token * decoding_ahead))


def _first(pair: tuple[Rank, RelQueryInfo]) -> Rank:
    return pair[0]


def batching_is_free(view: EngineView, c: Coefficients) -> bool:
    """The regime, from the fitted step cost: a batch as full as seats and KV allow costs
    less per-request time than one step's base (a GPU reading its weights), so every
    request added to a step rides nearly free and the batch should be filled."""
    tracker = view.tracker
    seqs = list(tracker.running.values())[:64] or list(tracker.waiting.values())[:64]
    if not seqs:
        return False
    mean_tokens = sum(seq.prompt_tokens + seq.max_tokens for seq in seqs) / len(seqs)
    full_batch = min(view.limits.max_num_seqs, view.limits.kv_capacity_tokens / mean_tokens)
    return c.per_decode * full_batch < c.base


def admission_pays(
    running_set: list[Remaining], candidate: Remaining, behind: int, c: Coefficients
) -> bool:
    """Δ < 0: admitting `candidate` now beats admitting it after the running set."""
    if not running_set:
        return True
    longest = max(left.steps for left in running_set)
    overlap = sum(min(candidate.steps, left.steps) for left in running_set)
    increase = (
        len(running_set) * c.per_token * candidate.prompt_tokens
        + c.per_decode * candidate.rows * overlap
    )
    running_alone = (
        c.per_token * sum(left.prompt_tokens for left in running_set)
        + c.base * longest
        + c.per_decode * sum(left.output_tokens for left in running_set)
    )
    shared = c.per_decode * sum(
        min(left.output_tokens, left.rows * candidate.steps) for left in running_set
    )
    reduction = running_alone - shared + behind * c.base * min(candidate.steps, longest)
    return increase - reduction < 0
