"""Stock vLLM V1 (0.32) as a policy: the engine relstream's users would otherwise run.

`vllm.v1.core.sched.scheduler.Scheduler.schedule()` step by step, so the simulator can
replay it and predict real V1 runs:

1. Running requests first, in list (admission) order, while the token budget
   (`max_num_batched_tokens`) lasts: a decode takes 1 token, an unfinished prompt the
   rest of it, cut to the budget left.
2. A running request whose next tokens need KV blocks the cache lacks preempts others by
   recompute until they fit: the last running request (FCFS), or the running request
   worst by (priority, arrival) (priority). If the victim is the request itself, the
   running pass ends there; a victim already scheduled gives its tokens back.
3. Only when nothing was preempted: waiting requests in queue order (FCFS: preempted
   ones first, then arrival order; priority: (priority, arrival, request order)) while
   budget and seats (`max_num_seqs`) remain. A request is admitted only if its whole
   current sequence fits in the free KV after its prefix-cache hit; the first one that
   does not fit ends admission. Its prompt is chunked to the budget left.

The first output token comes with the step that finishes a prompt (the simulator does
that). So V1 mixes prefill chunks into decode steps and, when full, behaves like
processor sharing.
"""

from __future__ import annotations

from collections.abc import Iterator

from relstream.scheduler.policies import Policy, static_priority
from relstream.scheduler.view import IDLE, EngineView, PrefillChunk, SeqInfo, StepPlan


class StockV1FCFS(Policy):
    """vLLM V1 with `scheduling_policy="fcfs"` (its default)."""

    name = "v1-fcfs"

    def plan(self, view: EngineView) -> StepPlan:
        return self.plan_step(view)  # V1 continues chunked prompts itself, in step 1

    def plan_step(self, view: EngineView) -> StepPlan:
        budget = view.limits.max_num_batched_tokens
        free = view.free_kv_tokens()
        running = list(view.tracker.running.values())
        scheduled: dict[str, int] = {}  # request id -> tokens this step
        growth: dict[str, int] = {}  # request id -> KV tokens its tokens need
        preempted: list[SeqInfo] = []
        index = 0
        while index < len(running) and budget > 0:
            seq = running[index]
            tokens = min(seq.uncomputed_tokens, budget)
            need = view.growth_kv_tokens(seq, tokens)
            while need > free:
                victim = self.victim(view, running)
                if running.index(victim) < index:
                    index -= 1
                running.remove(victim)
                preempted.append(victim)
                free += view.releasable_kv_tokens(victim) + growth.pop(victim.request_id, 0)
                budget += scheduled.pop(victim.request_id, 0)
                if victim is seq:
                    break
            if preempted and preempted[-1] is seq:
                break
            free -= need
            budget -= tokens
            scheduled[seq.request_id] = tokens
            growth[seq.request_id] = need
            index += 1
        admitted: list[PrefillChunk] = []
        if not preempted:
            admitted = self._admit(view, budget, free, len(running))
        return self._plan(view, scheduled, admitted, preempted)

    def victim(self, view: EngineView, running: list[SeqInfo]) -> SeqInfo:
        """The running request V1 preempts when KV runs out: the last one admitted."""
        return running[-1]

    def waiting_order(self, view: EngineView) -> Iterator[SeqInfo]:
        """Waiting requests in V1's queue order: a deque, preempted requests in front."""
        return iter(view.tracker.waiting.values())

    def _admit(
        self, view: EngineView, budget: int, free: int, seats_taken: int
    ) -> list[PrefillChunk]:
        admitted: list[PrefillChunk] = []
        for seq in self.waiting_order(view):
            if budget <= 0 or seats_taken >= view.limits.max_num_seqs:
                break
            cached = view.cached_prompt_tokens(seq)
            need = view.admission_kv_tokens(seq, cached)
            if need > free:
                break
            tokens = min(seq.uncomputed_tokens - cached, budget)
            admitted.append(PrefillChunk(seq.request_id, tokens))
            free -= need
            budget -= tokens
            seats_taken += 1
        return admitted

    @staticmethod
    def _plan(
        view: EngineView,
        scheduled: dict[str, int],
        admitted: list[PrefillChunk],
        preempted: list[SeqInfo],
    ) -> StepPlan:
        running = view.tracker.running
        prefill = [
            PrefillChunk(request_id, tokens)
            for request_id, tokens in scheduled.items()
            if not running[request_id].prefill_done
        ]
        decode = tuple(rid for rid in scheduled if running[rid].prefill_done)
        plan = StepPlan(
            prefill=(*prefill, *admitted),
            decode=decode,
            preempt=tuple(seq.request_id for seq in preempted),
        )
        return plan if plan.prefill or plan.decode or plan.preempt else IDLE


class StockV1Priority(StockV1FCFS):
    """vLLM V1 with `scheduling_policy="priority"`, each request carrying its relQuery's
    static priority (`static_priority`, smaller first), as relstream submits them."""

    name = "v1-priority"

    def victim(self, view: EngineView, running: list[SeqInfo]) -> SeqInfo:
        """The worst running request by (priority, arrival); among a relQuery's rows,
        which vLLM stamps in row order, the one admitted last."""
        ranked = ((*self._rank(view, seq.relquery_id), n, seq) for n, seq in enumerate(running))
        return max(ranked, key=lambda entry: entry[:3])[3]

    def waiting_order(self, view: EngineView) -> Iterator[SeqInfo]:
        """relQueries by (priority, arrival), each one's waiting rows in order."""
        waiting = [info for info in view.tracker.relqueries.values() if info.waiting]
        waiting.sort(key=lambda info: self._rank(view, info.relquery_id))
        for info in waiting:
            yield from info.waiting.values()

    @staticmethod
    def _rank(view: EngineView, relquery_id: str) -> tuple[int, float]:
        info = view.tracker.relqueries[relquery_id]
        priority = static_priority(info.prompt_tokens_seen, info.total_requests, info.max_tokens)
        return priority, info.arrival_time
