"""`relstream-lab bench fairshare`: two queries backlogged on one engine, in the simulator.

A heavy query (windows of `heavy_rows` rows) and a light one (`light_rows`) each
arrive, Poisson, at `load` times the rate the engine serves that query alone (measured
first: its first relQueries, CAPACITY_ROWS rows at least, arriving at once), so
together they ask for 2·`load` of the engine and both stay backlogged (the report says
in what share of the steps each had rows waiting). Over the first `minutes` of
arrivals, the engine's tokens (prompt tokens computed and outputs, as `relstream usage`
counts them) each query got, under relstream with fair share off and on (equal
weights, and 2:1 for the light query), and stock V1's FCFS.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from relstream.scheduler.data import StepPlan
from relstream.scheduler.fairshare import FairShare
from relstream.scheduler.relstream_policy import Relstream, RelstreamConfig
from relstream.sim.simulator import SimRelQuery, Simulator
from relstream_lab.common.report import pooled_document, rebuild, write_report
from relstream_lab.common.runner import make_cost_model
from relstream_lab.common.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream_lab.policies import make_sim_policy
from relstream_lab.sustained.run import load_profile, profile_label

QUERIES = ("heavy", "light")
CAPACITY_ROWS = 2000  # rows of a query served alone, at once, to measure its rate
SHARE_BOUNDS = (0.45, 0.55)  # the line for equal weights
# name -> fair weights (None: fair share off; "v1-fcfs": stock V1)
VARIANTS: dict[str, dict[str, float] | str | None] = {
    "relstream": None,
    "relstream fair 1:1": {},
    "relstream fair 1:2": {"light": 2.0},
    "v1-fcfs": "v1-fcfs",
}


@dataclass(frozen=True)
class FairOptions:
    profiles: tuple[str, ...]
    seeds: tuple[int, ...]
    heavy_rows: tuple[int, int]
    light_rows: tuple[int, int]
    load: float
    minutes: float
    datasets_dir: Path | None
    out_dir: Path
    workers: int = 2
    command: str = ""


class CountingSimulator(Simulator):
    """The simulator, counting the tokens each step computes for each query while the
    clock is before `until` (as fair share charges them, weight 1: a step as it runs,
    twins once), and the steps in which it had rows waiting."""

    def __init__(self, *args, until: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.until = until
        self.counted = FairShare()  # its counters, never lifted: each query's tokens
        self.waited = dict.fromkeys(QUERIES, 0)
        self.steps = 0

    @property
    def tokens(self) -> dict[str, float]:
        return {query: self.counted.counters.get(query, 0.0) for query in QUERIES}

    def execute(self, plan: StepPlan) -> list[str]:
        if self.clock < self.until:
            self.steps += 1
            for query in self._waiting_queries():
                self.waited[query] += 1
            self.counted.charge(self.tracker.unshared(plan), self.tracker)
        return super().execute(plan)

    def _waiting_queries(self) -> set[str]:
        """The queries with rows waiting (in arrival order, until each is seen)."""
        seen: set[str] = set()
        for seq in self.tracker.waiting.values():
            seen.add(self.tracker.relqueries[seq.relquery_id].query)
            if len(seen) == len(QUERIES):
                break
        return seen


def query_trace(query: str, rows: tuple[int, int], count: int, seed: int, block: int, datasets):
    config = TraceConfig(num_relqueries=count, min_rows=rows[0], max_rows=rows[1], seed=seed)
    trace = tokenize_trace(generate_relqueries(config, datasets), config)
    return [
        replace(rq, relquery_id=f"{query}-{rq.relquery_id}", query=query,
                requests=[replace(r, request_id=f"{query}-{r.request_id}") for r in rq.requests])
        for rq in trace.at_rate(1.0, block)
    ]  # fmt: skip


def run_cell(job: tuple[str, int, FairOptions]) -> list[dict]:
    """One profile and seed: each query's rate alone, then every variant on the mix."""
    spec, seed, options = job
    profile, name = load_profile(spec), profile_label(spec)
    datasets = load_datasets(options.datasets_dir)
    block, until = profile.limits.block_size, options.minutes * 60

    def policy(variant):
        cost = make_cost_model("online", profile)
        if isinstance(variant, str):
            return make_sim_policy(variant, cost)
        return Relstream(cost, RelstreamConfig(fair_weights=variant))

    mix: list[SimRelQuery] = []
    rates = {}
    sizes = (options.heavy_rows, options.light_rows)
    for index, (query, rows) in enumerate(zip(QUERIES, sizes, strict=True)):
        sample_size = -(-2 * CAPACITY_ROWS // (rows[0] + rows[1]))  # relQueries, on average
        sample = query_trace(query, rows, sample_size, seed * 10 + index, block, datasets)
        at_once = [replace(rq, arrival_time=0.0) for rq in sample]
        served = Simulator(profile, policy(None)).run(at_once).makespan
        rates[query] = options.load * sample_size / served
        count = int(rates[query] * until * 1.5) + 10
        trace = query_trace(query, rows, count, seed * 10 + index, block, datasets)
        scale = 1.0 / rates[query]  # the trace's gaps are for 1 relQuery a second
        mix += [replace(rq, arrival_time=rq.arrival_time * scale) for rq in trace]
    mix = [rq for rq in mix if rq.arrival_time < until]
    counts = {query: sum(1 for rq in mix if rq.query == query) for query in QUERIES}
    record = {"profile": name, "seed": seed, "rates": rates, "relqueries": counts}
    for label, variant in VARIANTS.items():
        sim = CountingSimulator(profile, policy(variant), until=until)
        run = sim.run(mix)
        waited = {query: sim.waited[query] / max(sim.steps, 1) for query in QUERIES}
        record[label] = {"tokens": sim.tokens, "makespan": run.makespan, "waiting_share": waited}
    return [record]


def shares(record: dict, label: str) -> dict[str, float]:
    tokens = record[label]["tokens"]
    total = sum(tokens.values())
    return {query: tokens[query] / total for query in QUERIES}


def run_fairshare(
    options: FairOptions, on_cell: Callable[[list[dict]], None] | None = None
) -> dict:
    document = pooled_document(options, run_cell, on_cell)
    write(options.out_dir, document)
    return document


def rebuild_report(out_dir: Path) -> dict:
    return rebuild(out_dir, write)


def write(out_dir: Path, document: dict) -> None:
    o = document["options"]
    setting = (
        f"Simulator; profiles {', '.join(o['profiles'])}; a heavy query (windows of "
        f"{o['heavy_rows'][0]}-{o['heavy_rows'][1]} rows) and a light one "
        f"({o['light_rows'][0]}-{o['light_rows'][1]} rows), each arriving at "
        f"{o['load']} of the rate the engine serves it alone, over {o['minutes']:g} "
        f"minutes; seeds {', '.join(map(str, o['seeds']))}."
    )
    write_report(out_dir, "Simulated benchmark: fair share between two backlogged queries",
                 document, setting, body(document["runs"]))  # fmt: skip


def body(runs: Sequence[dict]) -> list[str]:
    low, high = SHARE_BOUNDS
    lines = [
        "## Per run",
        "",
        f"The heavy query's share of the engine's tokens (prompt tokens computed and "
        f"outputs) over the trace's minutes; the light query has the rest. Equal weights: "
        f"the issue's line is each query within {low:.0%}-{high:.0%}; 1:2 asks 33 % for "
        f"the heavy one.",
        "",
        "| profile | seed | relQueries heavy / light | "
        + " | ".join(f"heavy share: {label}" for label in VARIANTS)
        + " | steps with rows waiting, heavy / light (1:1) | holds (1:1) |",
        "|---|---|---|" + "---|" * len(VARIANTS) + "---|---|",
    ]
    for r in runs:
        heavy = {label: shares(r, label)["heavy"] for label in VARIANTS}
        holds = low <= heavy["relstream fair 1:1"] <= high
        waited = r["relstream fair 1:1"].get("waiting_share", {})
        lines.append(
            f"| {r['profile']} | {r['seed']} | {r['relqueries']['heavy']} / "
            f"{r['relqueries']['light']} | "
            + " | ".join(f"{heavy[label]:.1%}" for label in VARIANTS)
            + f" | {waited.get('heavy', 0):.0%} / {waited.get('light', 0):.0%}"
            + f" | {'yes' if holds else 'no'} |"
        )
    return [*lines, ""]
