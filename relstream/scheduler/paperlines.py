"""Batch duration predictors (paper eq. batch_duration_function):

    L_prefill(p) = alpha_p * utok(p) + beta_p      (uncached prompt tokens)
    L_decode(d)  = alpha_d * req(d)  + beta_d      (requests in the decode batch)

`CostModel` keeps fixed coefficients (the paper fits them offline); `OnlineCostModel`
refits them from every executed pure step with recursive least squares, so no profiling
run is needed and a drifting machine is tracked; each slope is capped by what the steps
took per unit (`SlopeCeiling`).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from relstream.scheduler.data import StepFeedback, StepKind
from relstream.scheduler.remaining import Remaining

CEILING_DECILE = 0.1  # the quantile of time per unit that caps a slope (`SlopeCeiling`)


@dataclass
class Linear:
    slope: float
    intercept: float

    def __call__(self, x: float) -> float:
        return self.slope * x + self.intercept


@dataclass
class CostModel:
    prefill: Linear
    decode: Linear

    @property
    def alpha_d(self) -> float:
        return self.decode.slope

    @property
    def beta_d(self) -> float:
        return self.decode.intercept

    def prefill_time(self, uncached_tokens: float) -> float:
        return self.prefill(uncached_tokens)

    def decode_time(self, requests: float) -> float:
        return self.decode(requests)

    def observe(self, feedback: StepFeedback) -> None:
        """Fixed coefficients ignore feedback."""

    @classmethod
    def from_coefficients(cls, coefficients: dict[str, float]) -> CostModel:
        """The inverse of `coefficients()`."""
        return cls(
            Linear(coefficients["alpha_p"], coefficients["beta_p"]),
            Linear(coefficients["alpha_d"], coefficients["beta_d"]),
        )

    def coefficients(self) -> dict[str, float]:
        return {
            "alpha_p": self.prefill.slope,
            "beta_p": self.prefill.intercept,
            "alpha_d": self.decode.slope,
            "beta_d": self.decode.intercept,
        }


@dataclass(frozen=True)
class Coefficients:
    """A step's prices as a policy decides with them, for pricing what is left of a
    relQuery (W(R)) with today's batch sharing each decode step's base."""

    base: float
    per_token: float
    per_decode: float
    batch: int  # requests running now (at least 1)

    @classmethod
    def of(cls, cost: CostModel, running: int) -> Coefficients:
        """A cost model's lines as prices: a prompt token costs alpha_p, a decode
        alpha_d, and beta_d is each decode step's base."""
        return cls(cost.beta_d, cost.prefill.slope, cost.alpha_d, max(running, 1))

    @property
    def per_output(self) -> float:
        """What one output token costs: its decode and its share of the step's base."""
        return self.per_decode + self.base / self.batch

    def work(self, left: Remaining) -> float:
        """W(R): the engine time R adds, its steps shared with the batch."""
        return self.per_token * left.prompt_tokens + self.per_output * left.output_tokens


@dataclass
class RecursiveLeastSquares:
    """RLS for y = slope*x + intercept with exponential forgetting.

    Starts from a prior line with a covariance that lets a few dozen steps override it.
    Each of the covariance's eigenvalues is held at most at the prior variance:
    forgetting divides the covariance by λ every step, and along a direction the steps
    never vary (decodes of one batch size for hours, a saturated engine) nothing takes it
    back, so unbounded it reached inf after ~140,000 such steps and the gain's division
    failed. Clipping each direction alone keeps forgetting along the others (a bound on
    the trace would cancel it there, and the gain would fall like 1/n).
    """

    line: Linear
    forgetting: float = 0.995
    prior_variance: float = 1e3
    covariance: list[list[float]] = field(init=False)
    samples: int = 0

    def __post_init__(self) -> None:
        self.covariance = [[self.prior_variance, 0.0], [0.0, self.prior_variance]]

    def update(self, x: float, y: float) -> None:
        p = self.covariance
        # gain k = P·φ / (λ + φᵀ·P·φ) with regressor φ = (x, 1)
        p_phi = (p[0][0] * x + p[0][1], p[1][0] * x + p[1][1])
        denom = self.forgetting + x * p_phi[0] + p_phi[1]
        gain = (p_phi[0] / denom, p_phi[1] / denom)
        error = y - self.line(x)
        self.line.slope += gain[0] * error
        self.line.intercept += gain[1] * error
        # P ← (P − k·φᵀ·P) / λ; φᵀ·P equals p_phi because P is symmetric
        lam = self.forgetting
        covariance = [[(p[i][j] - gain[i] * p_phi[j]) / lam for j in range(2)] for i in range(2)]
        self.covariance = _clipped(covariance, self.prior_variance)
        self.samples += 1


def _clipped(matrix: list[list[float]], most: float) -> list[list[float]]:
    """A symmetric 2×2 matrix with each eigenvalue held at most at `most`."""
    (a, b), (_, d) = matrix
    half_sum, half_gap = (a + d) / 2, math.hypot((a - d) / 2, b)
    high, low = half_sum + half_gap, half_sum - half_gap
    if high <= most:
        return matrix
    # the eigenvector of `high`, (b, high - a) or (high - d, b), whichever is not zero
    x, y = (b, high - a) if abs(high - a) >= abs(high - d) else (high - d, b)
    norm = math.hypot(x, y)
    x, y = x / norm, y / norm
    top, other = most, min(low, most)  # M = top·uuᵀ + other·(I − uuᵀ)
    return [
        [other + (top - other) * x * x, (top - other) * x * y],
        [(top - other) * x * y, other + (top - other) * y * y],
    ]


class OnlineCostModel(CostModel):
    """CostModel whose coefficients follow the executed steps."""

    def __init__(self, prior: CostModel, forgetting: float = 0.995) -> None:
        super().__init__(
            Linear(prior.prefill.slope, prior.prefill.intercept),
            Linear(prior.decode.slope, prior.decode.intercept),
        )
        self._prefill_fit = RecursiveLeastSquares(Linear(**vars(self.prefill)), forgetting)
        self._decode_fit = RecursiveLeastSquares(Linear(**vars(self.decode)), forgetting)
        self._prefill_ceiling, self._decode_ceiling = SlopeCeiling(), SlopeCeiling()

    def observe(self, feedback: StepFeedback) -> None:
        # Mixed steps do not separate the two phases' costs, so only pure steps teach.
        if feedback.kind is StepKind.PREFILL:
            fit, ceiling, used = self._prefill_fit, self._prefill_ceiling, self.prefill
            units = feedback.uncached_tokens
        elif feedback.kind is StepKind.DECODE:
            fit, ceiling, used = self._decode_fit, self._decode_ceiling, self.decode
            units = feedback.decode_requests
        else:
            return
        fit.update(units, feedback.duration)
        ceiling.see(units, feedback.duration)
        _copy_non_negative(fit.line, used)
        most = ceiling.most()
        if used.slope > most:
            used.slope, used.intercept = most, ceiling.intercept(most)


@dataclass
class SlopeCeiling:
    """The most a line's slope can be: a step takes at least its per-unit part, so no
    unit (prompt token, decode request) costs more than a step's time over its units.
    Two pure prompt steps, one slowed fourfold by a process beside it, were a line of
    ten times the slope: the line through two points, extrapolated (an engine serving
    windows sees few pure prompt steps). The ceiling is the low decile of the last
    `window` steps' ratios, not their least, so that one mistimed step among many does
    not set it (among fewer than 11 it lies between the two least). Where it binds, the
    line's intercept is taken the same way (`intercept`): the line under the cheaper
    steps, as the slope is."""

    window: int = 64
    _steps: deque = field(init=False, repr=False)  # (units, duration)

    def __post_init__(self) -> None:
        self._steps = deque(maxlen=self.window)

    def see(self, units: float, duration: float) -> None:
        if units > 0:
            self._steps.append((units, duration))

    def most(self) -> float:
        """The ceiling (inf before any step with units)."""
        return _low_decile([duration / units for units, duration in self._steps])

    def intercept(self, slope: float) -> float:
        """The intercept under `slope`: the low decile of the steps' time less their
        units' part, at least 0."""
        return max(_low_decile([d - slope * units for units, d in self._steps]), 0.0)


def _low_decile(values: list[float]) -> float:
    """The `CEILING_DECILE` quantile, interpolated as numpy's (inf of none)."""
    if not values:
        return math.inf
    ordered = sorted(values)
    at = CEILING_DECILE * (len(ordered) - 1)
    low = math.floor(at)
    return ordered[low] + (at - low) * (ordered[min(low + 1, len(ordered) - 1)] - ordered[low])


COST_MODEL_KINDS = ("online", "fixed")


def cost_model_of(kind: str, prior: CostModel) -> CostModel:
    """`fixed` keeps `prior`, as the paper's offline fit would; `online` starts from it
    and refits on every executed step. The one place a kind becomes a model, for the
    simulator and the vLLM plug-in alike."""
    if kind == "fixed":
        return prior
    if kind == "online":
        return OnlineCostModel(prior)
    raise ValueError(f"cost_model must be 'online' or 'fixed', not {kind!r}")


def _copy_non_negative(fitted: Linear, used: Linear) -> None:
    """A line fitted on a narrow range can extrapolate below zero; durations cannot.
    The fit itself stays unconstrained so later steps can still correct it."""
    used.slope = max(fitted.slope, 0.0)
    used.intercept = max(fitted.intercept, 0.0)
