"""Engine-agnostic relQuery scheduling policy (never imports vLLM)."""

from relstream.scheduler.cost import CostModel, Linear, OnlineCostModel
from relstream.scheduler.policies import Policy, static_priority
from relstream.scheduler.registry import (
    DEFAULT_POLICY,
    POLICIES,
    PolicySpec,
    VllmQueue,
    make_policy,
    policy_spec,
)
from relstream.scheduler.view import (
    EngineLimits,
    EngineView,
    PrefillChunk,
    RelQueryInfo,
    RequestTracker,
    SeqInfo,
    StepFeedback,
    StepKind,
    StepPlan,
)

__all__ = [
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
    "make_policy",
    "policy_spec",
    "static_priority",
]
