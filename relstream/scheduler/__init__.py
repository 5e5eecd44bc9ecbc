"""Engine-agnostic relQuery scheduling policy (never imports vLLM)."""

from relstream.scheduler.cost import (
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
from relstream.scheduler.tracker import RequestTracker
from relstream.scheduler.view import (
    EngineLimits,
    EngineView,
    PrefillChunk,
    RelQueryInfo,
    SeqInfo,
    StepFeedback,
    StepKind,
    StepPlan,
)

__all__ = [
    "COST_MODEL_KINDS",
    "DEFAULT_POLICY",
    "POLICIES",
    "CostModel",
    "EngineLimits",
    "EngineView",
    "Linear",
    "OnlineCostModel",
    "Policy",
    "PolicySpec",
    "PrefillChunk",
    "RelQueryInfo",
    "RequestTracker",
    "SeqInfo",
    "StepFeedback",
    "StepKind",
    "StepPlan",
    "VllmQueue",
    "check_fair_share",
    "cost_model_of",
    "holds_twins",
    "make_policy",
    "policy_spec",
    "static_priority",
    "vllm_priority",
]
