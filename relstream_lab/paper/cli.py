"""`relstream-lab bench paper`: the paper's experiment on the simulated engine;
`bench scheduler-cost`: what a decision costs inside vLLM's own Scheduler."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_of, progress
from relstream.extras import require
from relstream.scheduler import DEFAULT_POLICY
from relstream.sim.profiles import PROFILE_NAMES
from relstream_lab.common.options import (
    canonical_command,
    print_top_rate,
    rates,
    trace_of,
    trace_options,
)
from relstream_lab.common.runner import RunSummary
from relstream_lab.policies import SIM_POLICIES


@click.command()
@click.option(
    "--profile", type=click.Choice(PROFILE_NAMES), default="a100-opt13b", show_default=True
)
@click.option(
    "--rates",
    default="0.25,0.5,0.75,1.0,1.25,1.5,2.0",
    show_default=True,
    callback=rates,
    help="Comma-separated relQuery arrival rates (relQueries/s).",
)
@click.option("--cost-model", type=click.Choice(["online", "fixed"]), default="online")
@click.option("--decision-benchmark/--no-decision-benchmark", default=True)
@trace_options(size=100)
def paper(**opts) -> None:
    """Replay the paper's relQuery trace under each policy and rate (simulator)."""
    from relstream_lab.paper.run import SimBenchOptions, run_sim_benchmark

    policies = opts["policies"] or SIM_POLICIES
    trace, datasets_dir, spelled = trace_of(opts)
    command = canonical_command(
        ["bench", "paper"],
        profile=opts["profile"],
        policies=",".join(policies),
        rates=",".join(f"{r:g}" for r in opts["rates"]),
        cost_model=opts["cost_model"],
        **spelled,
    )
    out_dir = opts["out"] or Path("docs/benchmarks") / f"sim-{opts['profile']}"
    options = SimBenchOptions(
        profile=opts["profile"],
        policies=policies,
        rates=opts["rates"],
        trace=trace,
        datasets_dir=datasets_dir,
        out_dir=out_dir,
        cost_model=opts["cost_model"],
        decision_benchmark=opts["decision_benchmark"],
        command=command,
    )
    with progress() as bar:
        task = bar.add_task("tokenizing trace", total=len(options.policies) * len(options.rates))

        def on_trace(count: int, requests: int) -> None:
            bar.update(task, description=f"simulating {count} relQueries ({requests} requests)")

        def on_run(summary: RunSummary) -> None:
            bar.advance(task)
            bar.console.print(
                f"  {summary.policy:<12} rate {summary.rate:<5g} mean {summary.mean:8.2f} s"
            )

        document = run_sim_benchmark(options, on_trace, on_run)
    print_top_rate(document, document["top_rate"])
    console.print(f"wrote {out_dir}/results.json, latency_vs_rate.png, breakdown.png, README.md")


@click.command("scheduler-cost")
@click.option(
    "--rows",
    default="1000,10000,100000",
    show_default=True,
    callback=csv_of(int),
    help="Comma-separated crowds of waiting rows, each timed under both schedulers.",
)
@click.option("--rows-per-relquery", default=50, show_default=True)
@click.option("--policy", default=DEFAULT_POLICY, show_default=True, help="The plug-in's policy.")
@click.option("--max-num-seqs", default=256, show_default=True)
@click.option("--budget", default=2048, show_default=True, help="Tokens a step may schedule.")
@click.option("--blocks", default=4096, show_default=True, help="KV cache blocks.")
@click.option("--warm-up", default=20, show_default=True, help="Steps before the timed ones.")
@click.option("--steps", default=200, show_default=True, help="Steps timed.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), required=True)
def scheduler_cost(rows: tuple[int, ...], policy: str, out: Path, **crowd: int) -> None:
    """What a scheduling decision costs inside vLLM's own Scheduler (no model run): stock
    V1 against relstream's plug-in, per crowd of waiting rows."""
    require("engine")
    from relstream_lab.paper.schedcost import Crowd, run_schedcost

    command = canonical_command(
        ["bench", "scheduler-cost"],
        rows=",".join(map(str, rows)),
        policy=policy,
        steps=crowd["steps"],
        out=out,
    )
    run_schedcost(out, rows, policy, Crowd(**crowd), command)
