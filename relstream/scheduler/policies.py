"""What every scheduling policy is: one StepPlan per engine iteration from an EngineView, so
the simulator and the vLLM plug-in run exactly the same decisions."""

from __future__ import annotations

from abc import ABC, abstractmethod

from relstream.placement.load import Load, counted_load
from relstream.scheduler.data import PrefillChunk, StepFeedback, StepPlan
from relstream.scheduler.paperlines import Coefficients, CostModel
from relstream.scheduler.remaining import remaining
from relstream.scheduler.steprecord import StepDecision
from relstream.scheduler.view import EngineView


def unfinished_prefills(view: EngineView) -> list[PrefillChunk]:
    """Running requests whose prompt was cut by the engine's token budget (chunked
    prefill); they finish before anything new starts, as in vLLM."""
    return [
        PrefillChunk(seq.request_id, seq.uncomputed_tokens)
        for seq in view.tracker.prompting.values()
    ]


def load_batch(view: EngineView) -> int:
    """The batch an engine's backlog runs in: every request it holds, up to its seats."""
    tracker = view.tracker
    held = len(tracker.waiting) + len(tracker.running)
    return max(1, min(view.limits.max_num_seqs, held))


class Policy(ABC):
    name: str
    # Why the last planned step is what it is, for the step log (None: nothing to say).
    decision: StepDecision | None = None

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def plan(self, view: EngineView) -> StepPlan:
        unfinished = unfinished_prefills(view)
        if unfinished:
            return StepPlan(prefill=tuple(unfinished))
        return self.plan_step(view)

    @abstractmethod
    def plan_step(self, view: EngineView) -> StepPlan:
        """The next step, when no chunked prompt is left half-computed."""

    def observe(self, feedback: StepFeedback) -> None:
        """A step as executed: refits the cost model (kept as given when fixed)."""
        self.cost.observe(feedback)

    def load(self, view: EngineView) -> Load:
        """What the engine reports for placement, as this policy prices it: each
        relQuery's work left (`remaining`, priced at the cost model's lines). A
        decode step's base is shared by the batch the backlog will run in (`load_batch`),
        not today's: a report made as work arrives would otherwise price it at one
        request a step."""
        c = Coefficients.of(self.cost, load_batch(view))
        relqueries = view.tracker.relqueries.values()
        works = [(info.priority, c.work(remaining(info))) for info in relqueries]
        total = sum((work for _, work in works), 0.0)
        return counted_load(total, c.per_token, c.per_output, works)

    def cost_coefficients(self) -> dict[str, float]:
        """The step costs this policy decides with, as last fitted (for reports)."""
        return self.cost.coefficients()
