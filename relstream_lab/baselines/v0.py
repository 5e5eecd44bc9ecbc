"""The paper's policies beside relstream's: vLLM V0's (FCFS, static priority with and
without eviction: prefill first, never mixed), Sarathi's chunked prefill, RelServe and its
two ablations. The lab registers them (`relstream_lab.baselines.register`), so the engine
and the simulator run them by name."""

from __future__ import annotations

from collections.abc import Iterator

from relstream.scheduler.data import IDLE, PrefillChunk, SeqInfo, StepPlan
from relstream.scheduler.paperlines import CostModel
from relstream.scheduler.policies import Policy
from relstream.scheduler.ranking import RankedQueue, StaticRanking
from relstream.scheduler.tracker import prefill_cap
from relstream.scheduler.view import EngineView
from relstream_lab.baselines.aba import Arrangement, Decision, PrefillCandidate, arrange
from relstream_lab.baselines.batching import (
    decode_candidate,
    preemption_victims,
    prefill_candidate,
)
from relstream_lab.baselines.dpu import DPUConfig, DynamicPriorityUpdater


def _prefill_or_decode(
    view: EngineView, chunks: list[PrefillChunk], preempt: tuple[str, ...] = ()
) -> StepPlan:
    """vLLM V0's arrangement: prefill whenever something fits, else decode everything."""
    if chunks:
        return StepPlan(prefill=tuple(chunks), preempt=preempt)
    decode = decode_candidate(view)
    return StepPlan(decode=decode) if decode else IDLE


class V0Fcfs(Policy):
    """vLLM V0's default: requests in arrival order, prefill prioritised, never mixed."""

    name = "v0-fcfs"

    def plan_step(self, view: EngineView) -> StepPlan:
        chunks = prefill_candidate(view, view.tracker.waiting.values())
        return _prefill_or_decode(view, chunks)


class V0Sp(Policy):
    """vLLM-SP: Prio(R) = Σ_{r∈R} tok(r) + OL(r), fixed when R is first seen (paper eq.
    request_priority with identity L1, L2); prefill first as in vLLM. Like RelServe, whose
    code base the paper's vLLM-SP shares, it never evicts a running request to admit one."""

    name = "v0-sp"
    evicts = False

    def __init__(self, cost: CostModel) -> None:
        super().__init__(cost)
        self._ranking = StaticRanking()
        self._queue = RankedQueue()  # fixed when R is first seen

    def plan_step(self, view: EngineView) -> StepPlan:
        self._admit_new(view)
        chunks = prefill_candidate(view, self._waiting_in_priority_order(view))
        head = next(self._waiting_in_priority_order(view), None)
        if chunks or head is None or not self.evicts:
            return _prefill_or_decode(view, chunks)
        victims, room = preemption_victims(view, head, self._rank)
        chunks = prefill_candidate(view, self._waiting_in_priority_order(view), room=room)
        return _prefill_or_decode(view, chunks, tuple(victims) if chunks else ())

    def _rank(self, seq: SeqInfo) -> tuple[float, float, float]:
        """(class negated, static priority, arrival): `StaticRanking`'s, by request."""
        rank = self._queue.rank_of(seq.relquery_id)
        assert rank is not None
        return (rank[0], rank[1], seq.arrival_time)

    def _admit_new(self, view: EngineView) -> None:
        relqueries = view.tracker.relqueries
        for relquery_id in sorted(view.tracker.drain_changed()):
            if relquery_id not in self._queue:
                self._queue.put(relquery_id, self._ranking.rank(relqueries[relquery_id], 0.0))
        while self._queue and (head := next(iter(self._queue)))[-1] not in relqueries:
            self._queue.drop(head[-1])  # finished ones leave from the front, lazily

    def _waiting_in_priority_order(self, view: EngineView) -> Iterator[SeqInfo]:
        relqueries = view.tracker.relqueries
        for rank in self._queue:
            info = relqueries.get(rank[-1])
            if info is not None:
                yield from info.waiting.values()


class V0SpEvict(V0Sp):
    """Static priority on vLLM V0's priority policy, which also evicts (by recompute)
    running requests ranked below a waiting one that cannot be admitted."""

    name = "v0-sp-evict"
    evicts = True


class Sarathi(Policy):
    """Sarathi-Serve: FCFS with chunked prefills mixed into every decode step under a
    token budget (each decode costs one token of the budget)."""

    name = "sarathi"

    def __init__(self, cost: CostModel, token_budget: int = 512) -> None:
        super().__init__(cost)
        self.token_budget = token_budget

    def plan(self, view: EngineView) -> StepPlan:
        return self.plan_step(view)  # it mixes unfinished prefills into the step itself

    def plan_step(self, view: EngineView) -> StepPlan:
        decode = decode_candidate(view)
        budget = self.token_budget - len(decode)
        chunks: list[PrefillChunk] = []
        cap = prefill_cap(view.limits, view.tracker)  # vLLM's long-prefill threshold
        for seq in view.tracker.running.values():  # finish started prefills first
            if budget <= 0:
                break
            if not seq.prefill_done:
                take = min(budget, seq.uncomputed_tokens, cap or budget)
                chunks.append(PrefillChunk(seq.request_id, take))
                budget -= take
        if budget > 0:
            chunks += prefill_candidate(
                view, view.tracker.waiting.values(), token_budget=budget, chunk_last=True
            )
        return StepPlan(prefill=tuple(chunks), decode=decode)


class RelServe(Policy):
    """DPU + ABA (paper §4). `arrangement` selects the ablations relserve-pp/-dp.

    Its "preemption" (m+ > m-) pauses the running decodes for a prefill; it never evicts
    KV: the prefill candidate is limited to what fits (paper §4.3)."""

    name = "relserve"

    def __init__(
        self,
        cost: CostModel,
        arrangement: Arrangement = Arrangement.ADAPTIVE,
        dpu_config: DPUConfig | None = None,
    ) -> None:
        super().__init__(cost)
        self.arrangement = arrangement
        self.dpu = DynamicPriorityUpdater(cost, dpu_config)
        self.last_decision: Decision | None = None

    def plan_step(self, view: EngineView) -> StepPlan:
        self.dpu.update(view)
        self.last_decision = None
        head = self.dpu.head(view)
        chunks = prefill_candidate(view, head.waiting.values()) if head else []
        decode = decode_candidate(view)
        if not chunks:
            return StepPlan(decode=decode) if decode else IDLE
        if not decode:
            return StepPlan(prefill=tuple(chunks))
        assert head is not None
        active = view.tracker.active_relqueries.values()
        m_plus = min(self.dpu.key(info) for info in active)
        candidate = PrefillCandidate(
            uncached_tokens=sum(chunk.num_tokens for chunk in chunks),
            requests=len(chunks),
            output_length=head.max_tokens,
        )
        running_lengths = [
            max(seq.remaining_output for seq in info.running.values()) for info in active
        ]
        waiting_relqueries = len(view.tracker.relqueries) - self._fully_running(view)
        self.last_decision = arrange(
            m_plus,
            self.dpu.key(head),
            candidate,
            running_lengths,
            waiting_relqueries,
            self.cost,
            self.arrangement,
        )
        if self.last_decision.prefill:
            return StepPlan(prefill=tuple(chunks))
        return StepPlan(decode=decode)

    @staticmethod
    def _fully_running(view: EngineView) -> int:
        return sum(1 for info in view.tracker.active_relqueries.values() if not info.waiting)


class RelServePP(RelServe):
    name = "relserve-pp"

    def __init__(self, cost: CostModel, dpu_config: DPUConfig | None = None) -> None:
        super().__init__(cost, Arrangement.PREFILL_FIRST, dpu_config)


class RelServeDP(RelServe):
    name = "relserve-dp"

    def __init__(self, cost: CostModel, dpu_config: DPUConfig | None = None) -> None:
        super().__init__(cost, Arrangement.DECODE_FIRST, dpu_config)
