"""Policies the simulator alone can run: the clairvoyant reference, beside every policy
of the registry (`relstream.scheduler.registry`)."""

from __future__ import annotations

import math

from relstream.scheduler import POLICIES, CostModel, Policy, make_policy
from relstream.scheduler.relstream import Relstream, RelstreamConfig
from relstream.scheduler.view import EngineView, StepPlan


class Clairvoyant(Relstream):
    """The throughput-preserving reference: V1's batches (relstream's admission), relQueries
    ranked by their exact remaining work (every row's true output length), no aging and
    no starvation guard, so nothing but the best order for the mean. No real engine can
    know this; every result says how far each policy is from it."""

    name = "clairvoyant"

    def __init__(self, cost: CostModel, config: RelstreamConfig | None = None) -> None:
        unbounded = RelstreamConfig(fcfs_slack=math.inf, size_weight=math.inf)
        super().__init__(cost, config or unbounded)

    def plan_step(self, view: EngineView) -> StepPlan:
        self.oracle = view.true_remaining_output  # a SimulatedEngine
        return super().plan_step(view)


SIM_ONLY: dict[str, type[Policy]] = {Clairvoyant.name: Clairvoyant}
SIM_POLICIES: tuple[str, ...] = (*POLICIES, *SIM_ONLY)


def make_sim_policy(name: str, cost: CostModel) -> Policy:
    if name in SIM_ONLY:
        return SIM_ONLY[name](cost)
    return make_policy(name, cost)
