"""Stock vLLM V1 (0.32, or 0.33 where they differ) as a policy: the engine relstream's
users would otherwise run.

`vllm.v1.core.sched.scheduler.Scheduler.schedule()` step by step, so the simulator can
replay it and predict real V1 runs:

1. Running requests first, in list (admission) order, while the token budget
   (`max_num_batched_tokens`) lasts: a decode takes 1 token, an unfinished prompt the
   rest of it, cut to the budget left.
2. A running request whose next tokens need KV blocks the cache lacks preempts others by
   recompute until they fit: the last running request (FCFS), or the running request
   worst by (priority, arrival) (priority). If the victim is the request itself, the
   running pass ends there (0.32) or goes on to the requests after it (0.33: only the
   priority queue can choose a victim that is not last); a victim already scheduled
   gives its tokens back.
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

from relstream.scheduler.admission import StepAdmission
from relstream.scheduler.data import SeqInfo, StepPlan
from relstream.scheduler.paperlines import CostModel
from relstream.scheduler.policies import Policy
from relstream.scheduler.ranking import StaticRanking, vllm_priority
from relstream.scheduler.view import EngineView

MODELLED_VLLM = (0, 32)  # the release installed here, whose real runs the simulator replays


class V1Fcfs(Policy):
    """vLLM V1 with `scheduling_policy="fcfs"` (its default), as release `vllm_version`
    (major, minor) schedules."""

    name = "v1-fcfs"

    def __init__(self, cost: CostModel, vllm_version: tuple[int, int] = MODELLED_VLLM) -> None:
        super().__init__(cost)
        self.vllm_version = vllm_version

    def plan(self, view: EngineView) -> StepPlan:
        return self.plan_step(view)  # V1 continues chunked prompts itself, in step 1

    def plan_step(self, view: EngineView) -> StepPlan:
        step = StepAdmission.for_step(view)
        running = list(view.tracker.running.values())
        step.run_running(
            running,
            lambda rows: self.victim(view, rows),
            self_preemption_ends_pass=self.vllm_version < (0, 33),
        )
        step.admit(self.waiting_order(view))
        return step.plan()

    def victim(self, view: EngineView, running: list[SeqInfo]) -> SeqInfo:
        """The running request V1 preempts when KV runs out: the last one admitted."""
        return running[-1]

    def waiting_order(self, view: EngineView) -> Iterator[SeqInfo]:
        """Waiting requests in V1's queue order: a deque, preempted requests in front."""
        return iter(view.tracker.waiting.values())


class V1Priority(V1Fcfs):
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

    ranking = StaticRanking()

    def _rank(self, view: EngineView, relquery_id: str) -> tuple[int, float]:
        """(priority, arrival): the static rank within the relQuery's class, as vLLM's
        heap compares the requests relstream submits (`ranking.vllm_priority`)."""
        info = view.tracker.relqueries[relquery_id]
        _, static, arrival, _ = self.ranking.rank(info, 0.0)
        return vllm_priority(info.priority, static), arrival
