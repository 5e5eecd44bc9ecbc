"""One cost line for every step, learned online from all of them, mixed steps included:

    L_step = base + per_token · uncached prompt tokens + per_decode · decode requests

V1-style engines mix prompt chunks into decode steps, so the paper's two separate lines
(fitted on pure steps only) would rarely see a step to learn from. The ratio
base / per_decode says which regime the engine is in: a GPU pays mostly `base` (batching
is nearly free), this project's CPU mostly `per_decode` (every request costs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relstream.scheduler.cost import CostModel
from relstream.scheduler.view import StepFeedback


@dataclass
class OnlineStepCost:
    """Recursive least squares over φ = (1, uncached tokens, decode requests) with
    exponential forgetting, starting from a prior the first few dozen steps override."""

    base: float
    per_token: float
    per_decode: float
    forgetting: float = 0.995
    prior_variance: float = 1e3
    samples: int = 0
    _covariance: list[list[float]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        v = self.prior_variance
        self._covariance = [[v, 0.0, 0.0], [0.0, v, 0.0], [0.0, 0.0, v]]

    @classmethod
    def from_prior(cls, cost: CostModel) -> OnlineStepCost:
        """The paper's two lines as a prior: decode's intercept is the step base."""
        return cls(cost.decode.intercept, cost.prefill.slope, cost.decode.slope)

    def step_time(self, uncached_tokens: float, decode_requests: float) -> float:
        return self.base + self.per_token * uncached_tokens + self.per_decode * decode_requests

    def observe(self, feedback: StepFeedback) -> None:
        phi = (1.0, float(feedback.uncached_tokens), float(feedback.decode_requests))
        p = self._covariance
        p_phi = [sum(p[i][j] * phi[j] for j in range(3)) for i in range(3)]
        denominator = self.forgetting + sum(phi[i] * p_phi[i] for i in range(3))
        gain = [value / denominator for value in p_phi]
        error = feedback.duration - self.step_time(phi[1], phi[2])
        self.base += gain[0] * error
        self.per_token += gain[1] * error
        self.per_decode += gain[2] * error
        # P ← (P − k·φᵀ·P) / λ; φᵀ·P equals p_phi because P is symmetric
        self._covariance = [
            [(p[i][j] - gain[i] * p_phi[j]) / self.forgetting for j in range(3)]
            for i in range(3)
        ]
        self.samples += 1

    def coefficients(self) -> tuple[float, float, float]:
        """(base, per_token, per_decode), never negative: a line fitted on a narrow range
        can extrapolate below zero; durations cannot."""
        return max(self.base, 0.0), max(self.per_token, 0.0), max(self.per_decode, 0.0)
