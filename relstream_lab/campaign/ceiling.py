"""How far ordering can take a real-engine campaign's traces: each epoch's fitted
profile replays a trace (every row ending where it really ended) under relstream and
under the clairvoyant reference (relstream's order on exact remaining work, in V1's
batches), beside stock V1. If the reference, told every true output length, does
not reach a target ratio, no estimate of remaining work will.

    relstream-lab bench ceiling docs/benchmarks/vllm-campaign --load 1.3 \
        --datasets ../shared/datasets

writes ceiling.json and ceiling.md in that folder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import click

from relstream.scheduler import CostModel, Policy
from relstream.scheduler.relstream_policy import Relstream
from relstream.sim.profiles import profile_from_document
from relstream.sim.simulator import Simulator
from relstream_lab.campaign.checkpoint import Checkpoint
from relstream_lab.common.runner import make_cost_model, summarize
from relstream_lab.common.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream_lab.policies import Clairvoyant, make_sim_policy

VARIANTS: dict[str, Callable[[CostModel], Policy]] = {
    "relstream": Relstream,
    "clairvoyant": Clairvoyant,
    "v1-fcfs": lambda cost: make_sim_policy("v1-fcfs", cost),
    "v1-priority": lambda cost: make_sim_policy("v1-priority", cost),
}
ORDERINGS = ("relstream", "clairvoyant")


def ceiling(out: Path, datasets_dir: Path | None, load: float, seeds: list[int]) -> list[dict]:
    """One record per (epoch, seed): every variant's simulated mean at `load`."""
    campaign = json.loads((out / "campaign.json").read_text())
    datasets = load_datasets(datasets_dir)
    records = []
    for epoch in Checkpoint(out, resume=True).epochs():
        profile = profile_from_document(json.loads((out / epoch.profile_file).read_text()))
        for seed in seeds:
            config = TraceConfig(**{**campaign["trace"], "burstiness": 1.0, "seed": seed})
            outputs_file = out / f"outputs-poisson-s{seed}.json"
            if not outputs_file.exists():
                raise click.BadParameter(
                    f"{outputs_file} is missing: the campaign has not run Poisson seed {seed}",
                    param_hint="--seeds",
                )
            outputs = json.loads(outputs_file.read_text())
            trace = tokenize_trace(generate_relqueries(config, datasets), config, outputs)
            relqueries = trace.at_rate(load * epoch.capacity, profile.limits.block_size)
            means = {}
            for variant, build in VARIANTS.items():
                policy = build(make_cost_model("online", profile))
                run = Simulator(profile, policy).run(relqueries)
                means[variant] = summarize(variant, load, run).mean
            records.append({"epoch": epoch.number, "seed": seed, "load": load, "mean": means})
    return records


def table(records: list[dict]) -> list[str]:
    """v1-fcfs (and v1-priority) mean over each ordering's mean."""
    lines = [
        "| epoch | seed | " + " | ".join(ORDERINGS) + " | relstream vs v1-priority "
        "| clairvoyant vs v1-priority |",
        "|---|---|" + "---|" * (2 * len(ORDERINGS)),
    ]
    for record in records:
        mean = record["mean"]
        cells = [f"{mean['v1-fcfs'] / mean[name]:.2f}x" for name in ORDERINGS]
        cells += [f"{mean['v1-priority'] / mean[name]:.2f}x" for name in ORDERINGS]
        lines.append(f"| {record['epoch']} | {record['seed']} | " + " | ".join(cells) + " |")
    return lines


def write_ceiling(out: Path, datasets_dir: Path, load: float, seeds: list[int]) -> list[str]:
    """`ceiling` at `load` into ceiling.json and ceiling.md in `out`; the table's lines."""
    records = ceiling(out, datasets_dir, load, seeds)
    (out / "ceiling.json").write_text(json.dumps(records, indent=2) + "\n")
    heading = f"Simulated at {load:g} of each epoch's capacity: v1-fcfs mean / each ordering's."
    lines = table(records)
    (out / "ceiling.md").write_text("\n".join([heading, "", *lines, ""]))
    return lines
