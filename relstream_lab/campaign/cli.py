"""`relstream-lab bench campaign`: the paper-style trace on the real engine (vLLM), resumable
across sessions and machines; `bench ceiling` and `bench frontier`: what the simulator says
ordering and the Δ gate can buy on a campaign's own traces."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_list, csv_of, progress, unwind_on_sigterm
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


campaign_dir = click.argument(
    "out", type=click.Path(exists=True, file_okay=False, path_type=Path), metavar="CAMPAIGN"
)


@click.command()
@campaign_dir
@click.option(
    "--load", type=float, default=1.3, show_default=True, help="fraction of each epoch's capacity"
)
@click.option(
    "--seeds",
    default="0,1,2",
    show_default=True,
    callback=csv_of(int),
    help="Poisson seeds the campaign has run",
)
@click.option(
    "--datasets",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="the tables the campaign ran on (its command's --datasets)",
)
def ceiling(out: Path, load: float, seeds: tuple[int, ...], datasets: Path) -> None:
    """How far ordering can take a campaign's traces (simulator): relstream and the
    clairvoyant reference against stock V1 on each epoch's fitted profile; writes
    ceiling.json and ceiling.md in CAMPAIGN (a campaign's --out folder)."""
    from relstream_lab.campaign.ceiling import write_ceiling

    click.echo("\n".join(write_ceiling(out, datasets, load, list(seeds))))


@click.command()
@campaign_dir
@click.option(
    "--seeds", default="0,1", show_default=True, callback=csv_of(int), help="Trace seeds."
)
@click.option(
    "--loads",
    default="0.75,1",
    show_default=True,
    callback=csv_of(float),
    help="Fractions of the campaign's measured capacity.",
)
@click.option(
    "--stretch",
    default="0,0.25,0.5,0.75,1",
    show_default=True,
    callback=csv_of(float),
    help="Exponents k of the gate's pressure, one row each.",
)
@click.option(
    "--datasets",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("../shared/datasets"),
    show_default=True,
    help="the tables the campaign ran on (its command's --datasets)",
)
@click.option(
    "--busy",
    is_flag=True,
    help="Instead: where each setting's busy time goes against the better stock V1's "
    "(step bases, prompt tokens, decodes, decode context), with steps and decodes.",
)
def frontier(
    out: Path,
    seeds: tuple[int, ...],
    loads: tuple[float, ...],
    stretch: tuple[float, ...],
    datasets: Path,
    busy: bool,
) -> None:
    """What the Δ gate can buy on a campaign's trace (simulator): relstream's mean and
    makespan against stock V1's for each k, as a markdown table on stdout."""
    from relstream_lab.campaign.frontier import frontier_lines

    for line in frontier_lines(out, seeds, loads, stretch, datasets, busy):
        click.echo(line)


@click.command()
@click.argument(
    "campaigns",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    metavar="CAMPAIGN...",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for README.md (its notes.md, if any, kept and appended).",
)
def repeats(campaigns: tuple[Path, ...], out: Path) -> None:
    """Campaigns run more than once, side by side: each cell's spread over its runs and
    the scheduler issue's lines on every run and on their mean (from each CAMPAIGN's
    results.json; rebuild those with `campaign --report-only` first)."""
    from relstream_lab.campaign.repeats import repeats_lines
    from relstream_lab.common.report import write_readme

    out.mkdir(parents=True, exist_ok=True)
    command = " ".join(["relstream-lab bench repeats", *map(str, campaigns), "--out", str(out)])
    lines = ["# Real-engine campaigns, repeated", "", "Reproduce with:", "", "```", command]
    write_readme(out, [*lines, "```", "", *repeats_lines(list(campaigns))])
    console.print(f"wrote {out}/README.md")
