"""Engine-agnostic relQuery scheduling policy (never imports vLLM)."""

from relstream.scheduler.cost import CostModel, Linear, OnlineCostModel
from relstream.scheduler.policies import POLICIES, Policy, make_policy
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
    "POLICIES",
    "CostModel",
    "EngineLimits",
    "EngineView",
    "Linear",
    "OnlineCostModel",
    "Policy",
    "PrefillChunk",
    "RelQueryInfo",
    "RequestTracker",
    "SeqInfo",
    "StepFeedback",
    "StepKind",
    "StepPlan",
    "make_policy",
]
