"""Engine-agnostic relQuery scheduling policy (never imports vLLM): its policies, their
registry and cost models from here, what a policy sees from `view` (`EngineView`), the
plain data it sees and returns from `data` alone."""

from relstream.scheduler.paperlines import (
    COST_MODEL_KINDS,
    CostModel,
    Linear,
    OnlineCostModel,
    cost_model_of,
)
from relstream.scheduler.policies import Policy
from relstream.scheduler.ranking import static_priority, vllm_priority
from relstream.scheduler.registry import (
    DEFAULT_POLICY,
    POLICIES,
    PolicySpec,
    VllmQueue,
    check_fair_share,
    holds_twins,
    make_policy,
    policy_spec,
)
from relstream.scheduler.view import EngineView

__all__ = [
    "COST_MODEL_KINDS",
    "DEFAULT_POLICY",
    "POLICIES",
    "CostModel",
    "EngineView",
    "Linear",
    "OnlineCostModel",
    "Policy",
    "PolicySpec",
    "VllmQueue",
    "check_fair_share",
    "cost_model_of",
    "holds_twins",
    "make_policy",
    "policy_spec",
    "static_priority",
    "vllm_priority",
]
