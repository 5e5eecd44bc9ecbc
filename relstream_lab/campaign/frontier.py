"""What the Δ gate can buy on a campaign's own trace and machine, predicted by the
simulator: relstream's mean against stock V1's, and its makespan, for each exponent k of
the gate's pressure (`scheduler/headroom.py`), beside the gate forced open and shut.

The real-engine targets ask for both at once on the campaign's 48-relQuery trace (issue
40: at moderate load a mean 1.5x below both stock V1 policies with the makespan within
5 %; at full load the makespan within 3 %); a row of this table is one setting of the
one knob that trades them, so a line that no row meets in a cell is out of reach of the
policy on that machine, whatever its setting. Identical requests are shared as the
campaign's engine shared them (`report.engine_sharing`), as in the report's replays.

    relstream-lab bench frontier docs/benchmarks/vllm-adaptive \\
        --seeds 0,1,2,3 --stretch 0,0.25,0.5,0.75,1 > docs/benchmarks/vllm-adaptive/frontier.md
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from relstream.sim.profiles import profile_from_document
from relstream.sim.sharing import Sharing
from relstream.sim.simulator import Simulator
from relstream_lab.campaign.busy import GAP_HEADER, BusyTime, book_busy_time, gap_line
from relstream_lab.campaign.report import engine_sharing
from relstream_lab.common.runner import RunSummary, make_cost_model, summarize
from relstream_lab.common.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream_lab.policies import RelstreamStretch, make_sim_policy

STOCK = ("v1-fcfs", "v1-priority")
REFERENCES = ("relstream-gated", "relstream-ungated")


def run(
    profile,
    relqueries,
    policy: str,
    stretch: float | None = None,
    sharing: Sharing | None = None,
    busy: BusyTime | None = None,
) -> RunSummary:
    """One simulated run; its busy time by term added to `busy` when given."""
    cost = make_cost_model("online", profile)
    built = make_sim_policy(policy, cost)
    if stretch is not None:
        built = RelstreamStretch(built.cost, stretch)
    if busy is not None:
        book_busy_time(built, profile, busy)
    return summarize(policy, 0.0, Simulator(profile, built, sharing).run(relqueries))


def cell(
    profile, relqueries, stretches: list[float], sharing: Sharing | None = None
) -> list[tuple[str, float, float, float]]:
    """(setting, better stock mean / its mean, makespan vs the better stock V1's, its max
    over v1-fcfs's) for each setting."""

    def served(name: str, stretch: float | None = None) -> RunSummary:
        return run(profile, relqueries, name, stretch, sharing)

    stock = {name: served(name) for name in STOCK}
    best_mean = min(r.mean for r in stock.values())
    best_makespan = min(r.makespan for r in stock.values())
    fcfs_max = stock["v1-fcfs"].max
    settings = [(f"k = {k:g}", served("relstream", k)) for k in stretches]
    settings += [(name, served(name)) for name in REFERENCES]
    return [
        (name, best_mean / r.mean, r.makespan / best_makespan - 1, r.max / fcfs_max)
        for name, r in settings
    ]


def busy_gaps(
    profile, relqueries, stretches: list[float], sharing: Sharing | None = None
) -> Iterator[str]:
    """`busy.gap_line` for each setting, against the stock V1 policy with the shorter
    makespan."""
    stock: dict[str, tuple[RunSummary, BusyTime]] = {}
    for name in STOCK:
        busy = BusyTime()
        stock[name] = (run(profile, relqueries, name, None, sharing, busy), busy)
    better = min(STOCK, key=lambda name: stock[name][0].makespan)
    settings = [(f"k = {k:g}", "relstream", k) for k in stretches]
    settings += [(name, name, None) for name in REFERENCES]
    for label, policy, stretch in settings:
        busy = BusyTime()
        run(profile, relqueries, policy, stretch, sharing, busy)
        yield gap_line(label, busy, better, stock[better][1])


def frontier_lines(
    out: Path,
    seeds: tuple[int, ...],
    loads: tuple[float, ...],
    stretches: tuple[float, ...],
    datasets_dir: Path,
    busy: bool = False,
) -> Iterator[str]:
    """The markdown table for the campaign in `out`, a line at a time as each is computed:
    one row per (seed, load, setting); with `busy`, where each setting's busy time goes
    against the better stock V1's instead (`busy.py`)."""
    campaign = json.loads((out / "campaign.json").read_text())
    capacity = json.loads((out / "capacity.json").read_text())["relqueries_per_s"]
    profile = profile_from_document(json.loads((out / "fitted_profile.json").read_text()))
    sharing = engine_sharing(campaign)
    datasets = load_datasets(datasets_dir)
    if busy:
        yield "| seed | load " + GAP_HEADER[0]
        yield "|---|---" + GAP_HEADER[1]
    else:
        yield ("| seed | load | setting | better stock mean / its mean "
               "| makespan vs better stock | max / v1-fcfs max |")  # fmt: skip
        yield "|---|---|---|---|---|---|"
    for seed in seeds:
        config = TraceConfig(**{**campaign["trace"], "seed": seed})
        outputs = out / f"outputs-{config.arrival}-s{seed}.json"
        real = json.loads(outputs.read_text()) if outputs.exists() else None
        trace = tokenize_trace(generate_relqueries(config, datasets), config, real)
        for load in loads:
            relqueries = trace.at_rate(load * capacity, profile.limits.block_size)
            if busy:
                for line in busy_gaps(profile, relqueries, list(stretches), sharing):
                    yield f"| {seed} | {load:g} {line}"
                continue
            rows = cell(profile, relqueries, list(stretches), sharing)
            for name, speedup, makespan, peak in rows:
                yield (f"| {seed} | {load:g} | {name} | {speedup:.2f}x | {makespan:+.1%} "
                       f"| {peak:.2f}x |")  # fmt: skip
