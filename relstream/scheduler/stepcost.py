"""One cost line for every step, learned online from all of them, mixed steps included:

    L_step = base + per_token · uncached prompt tokens + per_decode · decode requests
                  + per_context · KV tokens the decodes attend to

V1-style engines mix prompt chunks into decode steps, so the paper's two separate lines
(fitted on pure steps only) would rarely see a step to learn from. The ratio
base / per_decode says which regime the engine is in: a GPU pays mostly `base` (batching
is nearly free), this project's CPU mostly `per_decode` (every request costs).

The fit is least squares over the last `window` steps, redone every `refit_every` steps,
rather than recursive least squares with forgetting: that one's covariance winds up
through long runs of similar decode steps and its coefficients swing, flipping the
regime (docs/architecture/scheduler.md, "Step costs on this CPU with SmolLM2").
A step that stalled (the process descheduled beside other work) is left out of the fit:
the few prompt steps of a window set the per-token price, and one of them slowed tenfold
would price every prompt token tenfold.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from relstream.scheduler.data import StepFeedback
from relstream.scheduler.paperlines import CostModel

MIN_STEPS = 32  # below this many steps the prior stands
PIN_WEIGHT = 4.0  # how many steps' worth of evidence holds each coefficient to its last fit
STALL_SPREADS = 6.0  # a stalled step: this many spreads (1.4826 MAD) over its fitted time,
# and at least twice that time


def nonnegative_lstsq(
    design: np.ndarray, durations: np.ndarray, previous: np.ndarray | None = None
) -> np.ndarray:
    """Least squares whose per-feature costs (every column but the first, the base) are
    not negative: a cost that falls as work grows means the feature explains noise, so it
    is dropped and the rest refitted. With `previous`, each coefficient is held weakly to
    it (ridge), so a stretch of steps that cannot tell two costs apart (many decode steps
    of one batch size) leaves them where they were instead of splitting them at random.
    Not scipy's `nnls`: the base stays free and the ridge pin is part of the problem, and
    the scheduler core imports nothing beyond numpy."""
    if previous is not None:
        scale = np.sqrt(PIN_WEIGHT) * np.sqrt(np.mean(design**2, axis=0)) + 1e-12
        design = np.vstack([design, np.diag(scale)])
        durations = np.concatenate([durations, scale * previous])
    kept = list(range(design.shape[1]))
    while True:
        fitted, *_ = np.linalg.lstsq(design[:, kept], durations, rcond=None)
        negative = [k for k, c in zip(kept, fitted, strict=True) if c < 0 and k > 0]
        if not negative:
            break
        kept.remove(negative[0])
    coefficients = np.zeros(design.shape[1])
    coefficients[kept] = fitted
    return coefficients


def stalled(design: np.ndarray, durations: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """The steps that took far longer than the line says, in its own spread: a step is
    never much faster than its work, but a process descheduled mid-step is slower by
    whatever else ran."""
    predicted = design @ fitted
    excess = durations - predicted
    spread = 1.4826 * float(np.median(np.abs(excess)))
    return excess > np.maximum(STALL_SPREADS * spread, predicted)


@dataclass
class OnlineStepCost:
    base: float
    per_token: float
    per_decode: float
    per_context: float = 0.0
    window: int = 512
    refit_every: int = 16
    samples: int = 0
    _steps: deque = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._steps = deque(maxlen=self.window)

    @classmethod
    def from_prior(cls, cost: CostModel) -> OnlineStepCost:
        """The paper's two lines as a prior: decode's intercept is the step base."""
        return cls(cost.decode.intercept, cost.prefill.slope, cost.decode.slope)

    def step_time(self, uncached_tokens: float, decode_requests: float, context: float) -> float:
        return (
            self.base
            + self.per_token * uncached_tokens
            + self.per_decode * decode_requests
            + self.per_context * context
        )

    def observe(self, feedback: StepFeedback) -> None:
        phi = (
            1.0,
            float(feedback.uncached_tokens),
            float(feedback.decode_requests),
            float(feedback.context_tokens),
        )
        self._steps.append((phi, feedback.duration))
        self.samples += 1
        if self.samples >= MIN_STEPS and self.samples % self.refit_every == 0:
            design = np.array([phi for phi, _ in self._steps])
            durations = np.array([duration for _, duration in self._steps])
            previous = np.array(self.coefficients())
            fitted = nonnegative_lstsq(design, durations, previous)
            kept = ~stalled(design, durations, fitted)
            if not kept.all():
                fitted = nonnegative_lstsq(design[kept], durations[kept], previous)
            self.base, self.per_token, self.per_decode, self.per_context = (
                float(c) for c in fitted
            )

    def coefficients(self) -> tuple[float, float, float, float]:
        """(base, per_token, per_decode, per_context), none negative."""
        return (
            max(self.base, 0.0),
            max(self.per_token, 0.0),
            max(self.per_decode, 0.0),
            max(self.per_context, 0.0),
        )
