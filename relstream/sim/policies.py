"""Policies the simulator alone can run: the clairvoyant reference, beside every policy
of the registry (`relstream.scheduler.registry`)."""

from __future__ import annotations

from relstream.scheduler import POLICIES, CostModel, Policy, make_policy
from relstream.scheduler.relstream import Relstream
from relstream.scheduler.view import EngineView, StepPlan


class Clairvoyant(Relstream):
    """relstream's policy told every row's true output length: the same ordering on
    exact remaining work, the same admission and KV accounting. No real engine can know
    this; every result says how far each policy is from it."""

    name = "clairvoyant"

    def plan_step(self, view: EngineView) -> StepPlan:
        self.oracle = view.true_remaining_output  # a SimulatedEngine
        return super().plan_step(view)


SIM_ONLY: dict[str, type[Policy]] = {Clairvoyant.name: Clairvoyant}
SIM_POLICIES: tuple[str, ...] = (*POLICIES, *SIM_ONLY)


def make_sim_policy(name: str, cost: CostModel) -> Policy:
    if name in SIM_ONLY:
        return SIM_ONLY[name](cost)
    return make_policy(name, cost)
