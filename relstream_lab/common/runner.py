"""Replaying the trace through the simulated engine under each policy and rate."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from relstream.model import LatencyBreakdown
from relstream.scheduler import CostModel, cost_model_of
from relstream.sim.profiles import CostProfile
from relstream.sim.sharing import Sharing
from relstream.sim.simulator import SimRun, Simulator
from relstream_lab.common.workload import TokenizedTrace
from relstream_lab.policies import make_sim_policy


@dataclass(frozen=True)
class RunSummary:
    policy: str
    rate: float
    relqueries: int
    mean: float
    p50: float
    p99: float
    max: float
    waiting: float
    core: float
    tail: float
    makespan: float
    steps: dict[str, int]
    decision_us_median: float
    decision_us_p99: float
    cost_coefficients: dict[str, float]
    preemptions: int
    mean_by_query_type: dict[str, float]

    def as_dict(self) -> dict:
        return asdict(self)


def percentile(values: Sequence[float], fraction: float) -> float:
    """The observed value nearest the `fraction` rank (never one interpolated between
    two runs); NaN for no values."""
    if not values:
        return float("nan")
    return float(np.percentile(values, fraction * 100, method="nearest"))


@dataclass(frozen=True)
class Measured:
    """One answered relQuery, as a benchmark sees it."""

    latency: LatencyBreakdown
    query_type: str  # the trace's query type, "?" when unknown


def summarize_outcomes(
    policy: str,
    rate: float,
    outcomes: Sequence[Measured],
    decision_seconds: Sequence[float],
    **counts,
) -> RunSummary:
    """Latency statistics of one run; `counts` are makespan, steps, cost_coefficients,
    preemptions as the backend measured them."""
    totals = [o.latency.total for o in outcomes]
    decisions_us = [seconds * 1e6 for seconds in decision_seconds]
    by_type: dict[str, list[float]] = {}
    for outcome in outcomes:
        by_type.setdefault(outcome.query_type, []).append(outcome.latency.total)
    return RunSummary(
        policy=policy,
        rate=rate,
        relqueries=len(outcomes),
        mean=statistics.fmean(totals),
        p50=percentile(totals, 0.50),
        p99=percentile(totals, 0.99),
        max=max(totals),
        waiting=statistics.fmean(o.latency.waiting for o in outcomes),
        core=statistics.fmean(o.latency.core for o in outcomes),
        tail=statistics.fmean(o.latency.tail for o in outcomes),
        decision_us_median=percentile(decisions_us, 0.50),
        decision_us_p99=percentile(decisions_us, 0.99),
        mean_by_query_type={k: statistics.fmean(v) for k, v in sorted(by_type.items())},
        **counts,
    )


def summarize(policy: str, rate: float, run: SimRun) -> RunSummary:
    return summarize_outcomes(
        policy,
        rate,
        [Measured(o.latency, o.labels.get("query_type", "?")) for o in run.outcomes],
        run.decision_seconds,
        makespan=run.makespan,
        steps=run.step_counts,
        cost_coefficients=run.cost_coefficients,
        preemptions=run.preemptions,
    )


def make_cost_model(kind: str, profile: CostProfile, prior: CostModel | None = None) -> CostModel:
    """`fixed` uses the profile's fitted line (or `prior`, coefficients a real run was
    given) as the paper's offline fit would; `online` starts from it and refits on every
    executed step."""
    return cost_model_of(kind, prior or profile.prior())


def run_grid(
    trace: TokenizedTrace,
    profile: CostProfile,
    policies: Sequence[str],
    rates: Sequence[float],
    cost_model: str = "online",
    on_done: Callable[[RunSummary], None] | None = None,
    prior: CostModel | None = None,
    sharing: Sharing | None = None,
) -> list[RunSummary]:
    """Each policy at each rate; `sharing`: the work the simulated engine shares (none
    unless given, as stock vLLM)."""
    summaries = []
    for rate in rates:
        relqueries = trace.at_rate(rate, profile.limits.block_size)
        for name in policies:
            policy = make_sim_policy(name, make_cost_model(cost_model, profile, prior))
            run = Simulator(profile, policy, sharing).run(relqueries)
            summary = summarize(name, rate, run)
            summaries.append(summary)
            if on_done:
                on_done(summary)
    return summaries


def run_pooled(
    job: Callable[[Any], list[dict]],
    jobs: Sequence[Any],
    workers: int,
    on_done: Callable[[list[dict]], None] | None = None,
) -> list[dict]:
    """Each job's records, `workers` processes at once, in job order; `on_done` hears
    each job's records as they come."""
    records: list[dict] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        for done in pool.map(job, jobs):
            records += done
            if on_done:
                on_done(done)
    return records
