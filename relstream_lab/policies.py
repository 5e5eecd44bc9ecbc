"""Policies the simulator alone can run: the clairvoyant reference, relstream with its
gate forced open or shut (the two policies the load-shaped gate chooses between) and
relstream blind to deadlines, beside every policy of the registry
(`relstream.scheduler.registry`)."""

from __future__ import annotations

import math

from relstream.scheduler import POLICIES, CostModel, Policy, make_policy
from relstream.scheduler.relstream import Relstream, RelstreamConfig
from relstream.scheduler.view import EngineView, StepPlan


class Clairvoyant(Relstream):
    """The throughput-preserving reference: V1's batches (relstream's admission), relQueries
    ranked by their exact remaining work (every row's true output length), no aging and
    no starvation guard and no deadlines, so nothing but the best order for the mean. No
    real engine can know this; every result says how far each policy is from it."""

    name = "clairvoyant"

    def __init__(self, cost: CostModel, config: RelstreamConfig | None = None) -> None:
        unbounded = RelstreamConfig(
            fcfs_slack=math.inf, size_weight=math.inf, gate="never", deadlines=False
        )
        super().__init__(cost, config or unbounded)

    def plan_step(self, view: EngineView) -> StepPlan:
        self.oracle = view.true_remaining_output  # a Simulator
        return super().plan_step(view)


class RelstreamGated(Relstream):
    """Reference: the Δ gate in every step, relQueries ranked by their work alone, as
    relstream ran at commit 1f41818 (its batches small whatever the load, no deadlines)."""

    name = "relstream-gated"

    def __init__(self, cost: CostModel) -> None:
        super().__init__(
            cost, RelstreamConfig(size_weight=math.inf, gate="always", deadlines=False)
        )


class RelstreamUngated(Relstream):
    """Reference: V1's full batches in every step, as relstream ran at commit 5e404c3 (no
    deadlines)."""

    name = "relstream-ungated"

    def __init__(self, cost: CostModel) -> None:
        super().__init__(cost, RelstreamConfig(gate="never", deadlines=False))


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
