"""`relstream-lab bench campaign`: the paper-style trace on the real engine (vLLM), resumable
across sessions and machines."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_list, progress, unwind_on_sigterm
from relstream.engine.cpu import reexec_with_tcmalloc
from relstream.scheduler import DEFAULT_POLICY
from relstream_lab.common.options import (
    canonical_command,
    engine_options,
    print_top_rate,
    trace_of,
    trace_options,
)

STOCK_AND_OURS = ("v1-fcfs", "v1-priority", "relserve", DEFAULT_POLICY)


@click.command()
@engine_options
@click.option(
    "--seeds",
    default=None,
    callback=lambda _c, _p, v: csv_list(int, v) if v else None,
    help="Comma-separated trace seeds [--seed].",
)
@click.option(
    "--seeded-loads",
    default="",
    callback=lambda _c, _p, v: csv_list(float, v) if v else (),
    help="Loads run on every seed (the others on the first seed only).",
)
@click.option(
    "--arrivals",
    default=None,
    callback=lambda _c, _p, v: csv_list(str, v) if v else None,
    help="Comma-separated arrival processes, poisson and/or gamma [--arrival].",
)
@click.option("--resume", is_flag=True, help="Keep the runs already checkpointed in --out.")
@click.option(
    "--report-only",
    is_flag=True,
    help="Rebuild the report (fit, simulator replay, README) from the campaign checkpoint "
    "already in --out, without running the engine.",
)
@trace_options(size=24)
def campaign(**opts) -> None:
    """Run the paper-style trace on vLLM at fractions of its measured capacity."""
    from relstream_lab.campaign.report import save_campaign, write_vllm_report

    policies = opts["policies"] or STOCK_AND_OURS
    trace, datasets_dir, spelled = trace_of(opts)
    seeds = opts["seeds"] or (opts["seed"],)
    arrivals = opts["arrivals"] or (opts["arrival"],)
    unknown = set(arrivals) - {"poisson", "gamma"}
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(sorted(unknown))}", param_hint="--arrivals")
    command = canonical_command(
        ["bench", "campaign"],
        model=opts["model"],
        policies=",".join(policies),
        load=",".join(f"{r:g}" for r in opts["load"]),
        seeds=",".join(str(seed) for seed in seeds),
        seeded_loads=",".join(f"{load:g}" for load in opts["seeded_loads"]),
        arrivals=",".join(arrivals),
        **spelled,
    )
    out_dir = opts["out"] or Path("docs/benchmarks") / "vllm-cpu-smollm2"
    if not opts["report_only"]:
        reexec_with_tcmalloc()
        unwind_on_sigterm()
        from relstream_lab.campaign.checkpoint import MachineSpeedError
        from relstream_lab.campaign.run import VllmBenchOptions, run_vllm_benchmark, runs_to_do

        options = VllmBenchOptions(
            model=opts["model"],
            policies=policies,
            load_fractions=opts["load"],
            trace=trace,
            datasets_dir=datasets_dir,
            out_dir=out_dir,
            command=command,
            seeds=seeds,
            seeded_loads=opts["seeded_loads"],
            arrivals=arrivals,
            burstiness=opts["burstiness"],
            resume=opts["resume"],
        )
        with progress() as bar:
            task = bar.add_task(
                "machine speed, capacity if new (stock vLLM, whole trace at once)",
                total=runs_to_do(options) + 1,
            )

            def on_run(message: str) -> None:
                bar.advance(task)
                bar.update(task, description=message)
                bar.console.print(f"  {message}")

            if not options.resume or not (out_dir / "campaign.json").exists():
                out_dir.mkdir(parents=True, exist_ok=True)
                save_campaign(options)
            try:
                run_vllm_benchmark(options, on_run)
            except MachineSpeedError as error:
                raise click.ClickException(str(error)) from error
    document = write_vllm_report(out_dir, datasets_dir)
    print_top_rate(document, max(run["rate"] for run in document["runs"]))
    console.print(f"wrote {out_dir}/results.json, README.md, plots, {out_dir.name} checkpoint")
