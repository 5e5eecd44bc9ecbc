"""Policies the simulator alone can run: the clairvoyant reference, relstream with its
gate forced open or shut (the two policies the load-shaped gate chooses between), with
another exponent of the gate's pressure, and blind to deadlines, beside every policy of
the registry (`relstream.scheduler.registry`). Each is relstream with one hook
overridden; the product's policy carries none of these settings."""

from __future__ import annotations

import heapq
import math

from relstream.scheduler import POLICIES, CostModel, Policy, make_policy
from relstream.scheduler.admission import StepAdmission
from relstream.scheduler.data import RelQueryInfo, StepPlan
from relstream.scheduler.headroom import Headroom
from relstream.scheduler.paperlines import Coefficients
from relstream.scheduler.relstream_policy import Rank, Relstream, RelstreamConfig
from relstream.scheduler.steprecord import StepDecision
from relstream.scheduler.view import EngineView


class RelstreamUngated(Relstream):
    """Reference: V1's full batches in every step (one admission, `run_running` then
    `admit` in relstream's rank order), as relstream ran at commit 5e404c3; no deadlines
    unless a config says so."""

    name = "relstream-ungated"

    def __init__(self, cost: CostModel, config: RelstreamConfig | None = None) -> None:
        super().__init__(cost, config or RelstreamConfig(deadlines=False))

    def fill_step(
        self, view: EngineView, ranked: list[tuple[Rank, RelQueryInfo]], c: Coefficients
    ) -> StepPlan:
        step = StepAdmission.for_step(view)
        step.run_running([seq for _, info in ranked for seq in info.running.values()])
        started = (pair for pair in ranked if pair[1].waiting)
        merged = heapq.merge(started, self.waiting_ranked(view), key=lambda pair: pair[0])
        stop = step.admit(seq for _, info in merged for seq in info.waiting.values())
        self.decision = StepDecision(stop=stop)
        return step.plan()


class Clairvoyant(RelstreamUngated):
    """The throughput-preserving reference: V1's batches (relstream's admission), relQueries
    ranked by their exact remaining work (every row's true output length), no aging and
    no starvation guard and no deadlines, so nothing but the best order for the mean. No
    real engine can know this; every result says how far each policy is from it."""

    name = "clairvoyant"

    def __init__(self, cost: CostModel, config: RelstreamConfig | None = None) -> None:
        unbounded = RelstreamConfig(fcfs_slack=math.inf, size_weight=math.inf, deadlines=False)
        super().__init__(cost, config or unbounded)

    def plan_step(self, view: EngineView) -> StepPlan:
        self.oracle = view.true_remaining_output  # a Simulator
        return super().plan_step(view)


class RelstreamGated(Relstream):
    """Reference: the Δ gate in every step, relQueries ranked by their work alone, as
    relstream ran at commit 1f41818 (its batches small whatever the load, no deadlines)."""

    name = "relstream-gated"

    def __init__(self, cost: CostModel) -> None:
        super().__init__(cost, RelstreamConfig(size_weight=math.inf, deadlines=False))

    def pressure(self, view: EngineView, c: Coefficients) -> float:
        return 0.0


class RelstreamStretch(Relstream):
    """relstream with exponent `stretch` (k) in the gate's pressure (`headroom.py`), the
    knob `bench frontier` sweeps."""

    name = "relstream-stretch"

    def __init__(self, cost: CostModel, stretch: float) -> None:
        super().__init__(cost)
        self.headroom = Headroom(stretch=stretch)


class RelstreamNoDeadlines(Relstream):
    """Reference: relstream as it ranks without deadlines, on a trace that sets them (what
    honouring them gains)."""

    name = "relstream-no-deadlines"

    def __init__(self, cost: CostModel) -> None:
        super().__init__(cost, RelstreamConfig(deadlines=False))


SIM_ONLY: dict[str, type[Policy]] = {
    policy.name: policy
    for policy in (Clairvoyant, RelstreamGated, RelstreamUngated, RelstreamNoDeadlines)
}
SIM_POLICIES: tuple[str, ...] = (*POLICIES, *SIM_ONLY)


def make_sim_policy(name: str, cost: CostModel) -> Policy:
    if name in SIM_ONLY:
        return SIM_ONLY[name](cost)
    return make_policy(name, cost)
