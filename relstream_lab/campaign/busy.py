"""Where a policy's busy time goes, by the terms of the engine's step cost: step bases,
prompt tokens, decodes and decode context (a `LinearProfile`'s straight lines), so a
makespan lost against stock V1 can be put down to more steps (smaller batches), more
decodes (identical requests no longer in flight together, so not shared) or more
prompt tokens (a colder prefix cache)."""

from __future__ import annotations

from dataclasses import dataclass, field

from relstream.scheduler.data import StepFeedback
from relstream.scheduler.policies import Policy
from relstream.sim.profiles import LinearProfile

TERMS = ("base", "prompt", "decode", "context")


@dataclass
class BusyTime:
    """A run's steps, decodes and busy seconds, the seconds split by term."""

    steps: int = 0
    decodes: int = 0
    seconds: float = 0.0  # the steps' durations, summed
    terms: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TERMS, 0.0))

    def add(self, profile: LinearProfile, step: StepFeedback) -> None:
        self.steps += 1
        self.decodes += step.decode_requests
        self.seconds += step.duration
        split = profile.terms(step.uncached_tokens, step.decode_requests, step.context_tokens)
        for term, seconds in zip(TERMS, split, strict=True):
            self.terms[term] += seconds


def book_busy_time(policy: Policy, profile: LinearProfile, busy: BusyTime) -> None:
    """Add every step `policy` is told of (its `observe`) to `busy`."""
    observe = policy.observe

    def observed(step: StepFeedback) -> None:
        busy.add(profile, step)
        observe(step)

    policy.observe = observed  # type: ignore[method-assign]


def gap_line(name: str, own: BusyTime, stock_name: str, stock: BusyTime) -> str:
    """A markdown row: busy seconds more than `stock`'s, in all and by term, and steps and
    decodes side by side."""
    terms = " | ".join(f"{own.terms[t] - stock.terms[t]:+.1f}" for t in TERMS)
    return (
        f"| {name} | {stock_name} | {own.seconds - stock.seconds:+.1f} | {terms} "
        f"| {own.steps} / {stock.steps} | {own.decodes} / {stock.decodes} |"
    )


GAP_HEADER = (
    "| setting | against | busy s more | step bases | prompt tokens | decodes | decode context "
    "| steps (its / stock) | decodes (its / stock) |",
    "|---|---|---|---|---|---|---|---|---|",
)
