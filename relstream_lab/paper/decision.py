"""Timing one scheduling decision on a crowded engine: 1,000 waiting relQueries of ~50
requests (≈50,000 requests) and 256 running requests."""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import asdict, dataclass

from relstream.scheduler import DEFAULT_POLICY, make_policy
from relstream.scheduler.data import EngineLimits, StepKind
from relstream.sim.kvcache import block_hashes
from relstream.sim.profiles import RooflineProfile, get_profile
from relstream.sim.simulator import SimRelQuery, SimRequest, Simulator
from relstream_lab.common.runner import percentile


@dataclass(frozen=True)
class DecisionBenchmark:
    """Timings of a policy's plan(); the crowd sizes are medians over the timed steps."""

    policy: str
    waiting_relqueries: int
    waiting_requests: int
    running_requests: int
    timed_decisions: int
    median_us: float
    p99_us: float
    first_decision_ms: float  # ranks every newcomer once

    def as_dict(self) -> dict:
        return asdict(self)


def _crowd(relqueries: int, rows: int, seed: int, block_size: int) -> list[SimRelQuery]:
    rng = random.Random(seed)
    crowd = []
    for index in range(relqueries):
        template = [rng.randrange(49_000) for _ in range(40)]
        requests = []
        for row in range(rows):
            ids = template + [rng.randrange(49_000) for _ in range(rng.randint(80, 200))]
            # staggered lengths keep the running set refilling instead of draining at once
            output_length = rng.randint(20, 100)
            requests.append(
                SimRequest(
                    f"c{index}#{row}", len(ids), block_hashes(ids, block_size), output_length
                )
            )
        crowd.append(SimRelQuery(f"c{index}", 0.0, 100, requests))
    return crowd


def run_decision_benchmark(
    policy_name: str = DEFAULT_POLICY, relqueries: int = 1000, rows: int = 50, seed: int = 0
) -> DecisionBenchmark:
    base = get_profile("a100-opt13b")
    assert isinstance(base, RooflineProfile)
    # Room for 256 running requests of ~300 tokens: the crowd must fit, not the A100.
    limits = EngineLimits(
        max_num_seqs=256, max_num_batched_tokens=8192, kv_capacity_tokens=256 * 320, block_size=16
    )
    profile = RooflineProfile(**{**base.__dict__, "limits": limits})
    engine = Simulator(profile, make_policy(policy_name, base.prior()))
    for relquery in _crowd(relqueries, rows, seed, limits.block_size):
        engine.admit(relquery)
    started = time.perf_counter()
    plan = engine.policy.plan(engine)
    first = time.perf_counter() - started
    while len(engine.tracker.running) < limits.max_num_seqs and plan.kind is StepKind.PREFILL:
        engine.execute(plan)
        plan = engine.policy.plan(engine)
    timings = []
    crowd: list[tuple[int, int, int]] = []  # (running, waiting, waiting relQueries) seen
    for _ in range(200):
        engine.execute(plan)
        tracker = engine.tracker
        waiting_relqueries = sum(1 for info in tracker.relqueries.values() if info.waiting)
        crowd.append((len(tracker.running), len(tracker.waiting), waiting_relqueries))
        started = time.perf_counter()
        plan = engine.policy.plan(engine)
        timings.append(time.perf_counter() - started)
    return DecisionBenchmark(
        policy=policy_name,
        waiting_relqueries=int(statistics.median(c[2] for c in crowd)),
        waiting_requests=int(statistics.median(c[1] for c in crowd)),
        running_requests=int(statistics.median(c[0] for c in crowd)),
        timed_decisions=len(timings),
        median_us=statistics.median(timings) * 1e6,
        p99_us=percentile(timings, 0.99) * 1e6,
        first_decision_ms=first * 1e3,
    )
