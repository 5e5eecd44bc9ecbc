"""`relstream-lab bench sustained`: policies ranked under the load a stream lives under.

A short burst ends before a queue reaches steady state, so it cannot show a policy that
finishes less work per second: here every trace is long (300 relQueries of 1-48 rows by
default), arrives as a Poisson or a bursty gamma process, and is replayed at fixed
fractions of the capacity stock V1 reaches on that very trace (its FCFS policy serving
every relQuery at once: relQueries over makespan). Each run reports its mean, p50, p99
and max latency, its makespan (the throughput figure) and the mean latency of the last
third of relQueries over the first third (above 1, a queue that grows while the stream
runs). With `deadlines`, every relQuery is due that many times its latency alone after
its arrival (`bench.deadlines`) and each run also reports the share of deadlines met.

Profiles are the simulator's named ones or profile files (a campaign epoch's fitted
`fitted_profile*.json`), labelled by file name.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from relstream.scheduler.relstream_policy import Relstream, RelstreamConfig
from relstream.sim.profiles import PROFILE_NAMES, CostProfile, get_profile, profile_from_document
from relstream.sim.simulator import SimRun, Simulator
from relstream_lab.common.runner import make_cost_model, run_pooled, summarize
from relstream_lab.common.workload import (
    TokenizedTrace,
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream_lab.policies import make_sim_policy
from relstream_lab.sustained.deadlines import alone_latencies, attainment, with_deadlines

POLICIES = ("relstream", "v1-fcfs", "v1-priority", "clairvoyant")
STOCK = ("v1-fcfs", "v1-priority")
ALL_AT_ONCE = 1e9  # relQueries/s: every relQuery arrives at time 0 (the capacity run)


@dataclass(frozen=True)
class SustainedOptions:
    profiles: tuple[str, ...]  # profile names or profile files
    datasets_dir: Path | None
    out_dir: Path
    arrivals: tuple[str, ...] = ("poisson", "gamma")
    burstiness: float = 2.0  # gamma arrivals: CV of the gaps
    seeds: tuple[int, ...] = (0, 1, 2)
    loads: tuple[float, ...] = (0.8, 0.95, 1.1)
    policies: tuple[str, ...] = POLICIES
    relqueries: int = 300
    max_rows: int = 48
    workers: int = 2
    fcfs_slack: float | None = None  # relstream's deadline slack, if not its default
    size_weight: float | None = None  # relstream's rank: arrival + this × W, if given
    deadlines: float | None = None  # each relQuery due this times its latency alone
    command: str = ""

    def trace(self, arrival: str, seed: int) -> TraceConfig:
        burstiness = self.burstiness if arrival == "gamma" else 1.0
        return TraceConfig(
            num_relqueries=self.relqueries,
            max_rows=self.max_rows,
            arrival=arrival,
            burstiness=burstiness,
            seed=seed,
        )


@dataclass(frozen=True)
class Cell:
    """One profile on one trace: a capacity run, then every policy at every load."""

    profile: str
    arrival: str
    seed: int


def load_profile(spec: str) -> CostProfile:
    """A named profile, or a profile file (JSON) such as a campaign's fitted profile."""
    if spec in PROFILE_NAMES:
        return get_profile(spec)
    path = Path(spec)
    if not path.is_file():
        known = ", ".join(PROFILE_NAMES)
        raise ValueError(f"profile {spec!r} is neither a name ({known}) nor a file")
    return profile_from_document(json.loads(path.read_text()))


def profile_label(spec: str) -> str:
    """How a profile is named in the report: its name, or its folder and file stem."""
    if spec in PROFILE_NAMES:
        return spec
    path = Path(spec)
    return f"{path.parent.name}/{path.stem}"


def thirds_ratio(run: SimRun, arrival_order: dict[str, int]) -> float:
    """Mean latency of the last third of relQueries (by arrival) over the first third's."""
    by_arrival = sorted(run.outcomes, key=lambda o: arrival_order[o.relquery_id])
    third = max(len(by_arrival) // 3, 1)
    first = statistics.fmean(o.latency.total for o in by_arrival[:third])
    last = statistics.fmean(o.latency.total for o in by_arrival[-third:])
    return last / first


def run_cell(cell: Cell, trace: TokenizedTrace, options: SustainedOptions) -> dict:
    """The capacity run, then one record per (load, policy)."""
    profile = load_profile(cell.profile)
    block = profile.limits.block_size

    def serve(policy: str, rate: float) -> SimRun:
        built = make_sim_policy(policy, make_cost_model("online", profile))
        if policy == Relstream.name:
            config = RelstreamConfig()
            if options.fcfs_slack is not None:
                config = replace(config, fcfs_slack=options.fcfs_slack)
            if options.size_weight is not None:
                config = replace(config, size_weight=options.size_weight)
            built = Relstream(built.cost, config)
        relqueries = trace.at_rate(rate, block)
        if alone is not None:
            relqueries = with_deadlines(relqueries, alone, options.deadlines)
        return Simulator(profile, built).run(relqueries)

    alone = None
    if options.deadlines is not None:  # once per trace and profile, for every load
        alone = alone_latencies(trace.at_rate(ALL_AT_ONCE, block), profile)
    capacity = len(trace.entries) / serve("v1-fcfs", ALL_AT_ONCE).makespan
    arrival_order = {entry.relquery.id: n for n, entry in enumerate(trace.entries)}
    records = []
    for load in options.loads:
        for policy in options.policies:
            run = serve(policy, load * capacity)
            summary = summarize(policy, load * capacity, run)
            met = {} if alone is None else {"attainment": attainment(run)}
            records.append(
                {
                    "profile": profile_label(cell.profile),
                    "arrival": cell.arrival,
                    "seed": cell.seed,
                    "load": load,
                    "policy": policy,
                    "mean": summary.mean,
                    "p50": summary.p50,
                    "p99": summary.p99,
                    "max": summary.max,
                    "makespan": summary.makespan,
                    "thirds": thirds_ratio(run, arrival_order),
                    "preemptions": summary.preemptions,
                    "steps": summary.steps,
                    **met,
                }
            )
    return {"cell": asdict(cell), "capacity": capacity, "records": records}


def _trace_job(job: tuple[str, int, SustainedOptions]) -> list[dict]:
    """Every profile's cell on one trace, tokenized once."""
    arrival, seed, options = job
    trace = _trace(options, arrival, seed)
    return [run_cell(Cell(spec, arrival, seed), trace, options) for spec in options.profiles]


def _trace(options: SustainedOptions, arrival: str, seed: int) -> TokenizedTrace:
    config = options.trace(arrival, seed)
    return tokenize_trace(generate_relqueries(config, load_datasets(options.datasets_dir)), config)


def run_sustained(
    options: SustainedOptions, on_trace: Callable[[list[dict]], None] | None = None
) -> list[dict]:
    """Every (profile, arrival, seed) cell, one trace (all its profiles) per worker at a
    time, `workers` at once; `on_trace` after each trace."""
    for spec in options.profiles:
        load_profile(spec)  # a bad name fails now, not in a worker
    jobs = [(arrival, seed, options) for arrival in options.arrivals for seed in options.seeds]
    return run_pooled(_trace_job, jobs, options.workers, on_trace)


def group(records: Sequence[dict]) -> dict[tuple[str, str, float], dict[str, list[dict]]]:
    """Records by (profile, arrival, load), then by policy, seeds in order."""
    grouped: dict[tuple[str, str, float], dict[str, list[dict]]] = {}
    for record in records:
        key = (record["profile"], record["arrival"], record["load"])
        grouped.setdefault(key, {}).setdefault(record["policy"], []).append(record)
    for policies in grouped.values():
        for runs in policies.values():
            runs.sort(key=lambda record: record["seed"])
    return grouped
