"""Deadlines on the sustained benchmark's traces (`deadlinereport`: how many were met).

`relstream-lab bench sustained --deadlines F` gives every relQuery the deadline arrival +
F × its latency alone: what stock V1 (FCFS) takes to answer it on an empty engine, each
relQuery simulated by itself once per trace and profile. A user who asks for three
times what the relQuery takes alone asks for something every relQuery could get on an
idle engine and none is promised on a busy one. Stock V1 policies ignore deadlines (they
are vLLM's own); `relstream` honours them, and `relstream-no-deadlines` is the same
policy blind to them: the gain is relstream's attainment over the best of v1-fcfs,
v1-priority and relstream-no-deadlines, on every run.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace

from relstream.sim.profiles import CostProfile
from relstream.sim.simulator import SimRelQuery, SimRun, Simulator
from relstream_lab.common.runner import make_cost_model
from relstream_lab.policies import make_sim_policy


def alone_latencies(relqueries: Sequence[SimRelQuery], profile: CostProfile) -> dict[str, float]:
    """Each relQuery's latency on an empty engine under stock V1 (FCFS), by id."""
    latencies = {}
    for relquery in relqueries:
        policy = make_sim_policy("v1-fcfs", make_cost_model("online", profile))
        run = Simulator(profile, policy).run([replace(relquery, arrival_time=0.0)])
        latencies[relquery.relquery_id] = run.outcomes[0].latency.total
    return latencies


def with_deadlines(
    relqueries: Sequence[SimRelQuery], alone: dict[str, float], factor: float
) -> list[SimRelQuery]:
    """The relQueries, each due `factor` times its latency alone after its arrival."""
    return [
        replace(rq, deadline=rq.arrival_time + factor * alone[rq.relquery_id]) for rq in relqueries
    ]


def attainment(run: SimRun) -> float:
    """The share of relQueries answered by their deadline."""
    return statistics.fmean(bool(outcome.deadline_met) for outcome in run.outcomes)
