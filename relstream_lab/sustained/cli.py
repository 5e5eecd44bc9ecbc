"""`relstream-lab bench sustained`: long traces near capacity on the simulated engine."""

from __future__ import annotations

import os
from pathlib import Path

import click

from relstream.cli.common import console, csv_of, progress
from relstream_lab.common.options import datasets_option

CAMPAIGN = Path("docs/benchmarks/vllm-campaign")
DEFAULT_PROFILES = (
    "cpu-smollm2",
    f"{CAMPAIGN}/fitted_profile.json",
    f"{CAMPAIGN}/fitted_profile-e1.json",
    "a100-opt13b",
)


@click.command()
@click.option(
    "--profiles",
    default=",".join(DEFAULT_PROFILES),
    show_default=True,
    callback=csv_of(str),
    help="Profile names or profile files (a campaign epoch's fitted_profile*.json).",
)
@click.option("--arrivals", default="poisson,gamma", show_default=True, callback=csv_of(str))
@click.option("--burstiness", default=2.0, show_default=True, help="Gamma arrivals: CV.")
@click.option("--seeds", default="0,1,2", show_default=True, callback=csv_of(int))
@click.option(
    "--loads",
    default="0.8,0.95,1.1",
    show_default=True,
    callback=csv_of(float),
    help="Fractions of stock V1's capacity on each trace.",
)
@click.option(
    "--policies",
    default="relstream,relstream-gated,relstream-ungated,v1-fcfs,v1-priority,clairvoyant",
    show_default=True,
    callback=csv_of(str),
)
@click.option("--relqueries", default=300, show_default=True, type=click.IntRange(1))
@click.option("--max-rows", default=48, show_default=True, type=click.IntRange(1))
@datasets_option
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1))
@click.option(
    "--fcfs-slack",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="relstream's deadline: this times a relQuery's FCFS latency [its default].",
)
@click.option(
    "--size-weight",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="relstream ranks by arrival + this × its work (engine seconds) [work alone].",
)
@click.option(
    "--deadlines",
    type=click.FloatRange(min=0.0, min_open=True),
    default=None,
    help="Each relQuery due this times its latency alone (stock V1, empty engine); adds "
    "relstream-no-deadlines and the deadline attainment report.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("docs/benchmarks/sustained"),
    show_default=True,
)
@click.option(
    "--report-only",
    is_flag=True,
    help="Rebuild README.md and the plot from --out's results.json (after editing notes.md).",
)
def sustained(**opts) -> None:
    """Rank policies on long traces at fractions of stock V1's capacity (simulator)."""
    from relstream_lab.sustained.run import SustainedOptions, run_sustained

    if opts["report_only"]:
        _rebuild(opts["out"])
        return

    for arrival in opts["arrivals"]:
        if arrival not in ("poisson", "gamma"):
            raise click.BadParameter(f"{arrival!r}: poisson or gamma", param_hint="--arrivals")
    needed = ("v1-fcfs", "v1-priority", "relstream")
    missing = [name for name in needed if name not in opts["policies"]]
    if missing:
        raise click.BadParameter(f"the report needs {', '.join(missing)}", param_hint="--policies")
    if opts["deadlines"] and "relstream-no-deadlines" not in opts["policies"]:
        opts["policies"] = (*opts["policies"], "relstream-no-deadlines")
    datasets = opts["datasets"] if opts["datasets"].is_dir() else None
    if datasets is None:
        console.print(f"[yellow]{opts['datasets']} not found: using the bundled sample table[/]")
    command = (
        f"relstream-lab bench sustained --profiles {','.join(opts['profiles'])} "
        f"--arrivals {','.join(opts['arrivals'])} --burstiness {opts['burstiness']:g} "
        f"--seeds {','.join(map(str, opts['seeds']))} "
        f"--loads {','.join(f'{load:g}' for load in opts['loads'])} "
        f"--policies {','.join(opts['policies'])} --relqueries {opts['relqueries']} "
        f"--max-rows {opts['max_rows']} "
        + (f"--fcfs-slack {opts['fcfs_slack']:g} " if opts["fcfs_slack"] else "")
        + (f"--size-weight {opts['size_weight']:g} " if opts["size_weight"] else "")
        + (f"--deadlines {opts['deadlines']:g} " if opts["deadlines"] else "")
        + f"--datasets {os.path.relpath(datasets) if datasets else 'bundled'}"
    )
    options = SustainedOptions(
        profiles=opts["profiles"],
        datasets_dir=datasets,
        out_dir=opts["out"],
        arrivals=opts["arrivals"],
        burstiness=opts["burstiness"],
        seeds=opts["seeds"],
        loads=opts["loads"],
        policies=opts["policies"],
        relqueries=opts["relqueries"],
        max_rows=opts["max_rows"],
        workers=opts["workers"],
        fcfs_slack=opts["fcfs_slack"],
        size_weight=opts["size_weight"],
        deadlines=opts["deadlines"],
        command=command,
    )
    traces = len(options.arrivals) * len(options.seeds)
    try:
        with progress() as bar:
            task = bar.add_task("traces (arrival × seed), every profile", total=traces)
            results = run_sustained(options, lambda _cells: bar.advance(task))
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--profiles") from None
    capacities = [{**result["cell"], "capacity": result["capacity"]} for result in results]
    records = [record for result in results for record in result["records"]]
    verdicts = write_sustained_report(options, capacities, records)
    failing = [v for v in verdicts if not v.holds]
    console.print(f"{len(verdicts) - len(failing)} of {len(verdicts)} target checks hold")
    console.print(f"report: {options.out_dir / 'README.md'}")


def _rebuild(out: Path) -> None:
    import json

    from relstream_lab.sustained.run import SustainedOptions

    try:
        document = json.loads((out / "results.json").read_text())
    except FileNotFoundError:
        raise click.BadParameter(f"no results.json in {out}", param_hint="--out") from None
    saved = document["options"]
    datasets_dir = saved.pop("datasets_dir")
    datasets = Path(datasets_dir) if datasets_dir else None
    options = SustainedOptions(
        command=document["command"], datasets_dir=datasets, out_dir=out, **saved
    )
    write_sustained_report(options, document["capacities"], document["runs"], document["machine"])
    console.print(f"report: {out / 'README.md'}")


def write_sustained_report(
    options, capacities: list[dict], records: list[dict], machine: str | None = None
) -> list:
    """results.json, README.md and plot in the out folder; the verdicts."""
    from relstream_lab.common.report import machine_description, write_report
    from relstream_lab.sustained.deadlinereport import judge_deadlines, markdown_deadlines
    from relstream_lab.sustained.report import judge, markdown_table, markdown_verdicts, plot

    verdicts = judge(records) + judge_deadlines(records)
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    plot(records, out / "mean_vs_load.png")
    document = {
        "command": options.command,
        "machine": machine or machine_description(),
        "options": {
            "profiles": list(options.profiles),
            "datasets_dir": str(options.datasets_dir) if options.datasets_dir else None,
            "arrivals": list(options.arrivals),
            "burstiness": options.burstiness,
            "seeds": list(options.seeds),
            "loads": list(options.loads),
            "relqueries": options.relqueries,
            "max_rows": options.max_rows,
            "deadlines": options.deadlines,
        },
        "capacities": capacities,
        "runs": records,
        "verdicts": [vars(v) for v in verdicts],
    }
    setting = (
        f"{options.relqueries} relQueries of 1-{options.max_rows} rows a trace, seeds "
        f"{', '.join(map(str, options.seeds))}; gamma arrivals with CV {options.burstiness:g}. "
        "Load: a fraction of the capacity stock V1 (FCFS) reaches on the same trace "
        "serving every relQuery at once (relQueries / makespan). Reference: the "
        "clairvoyant policy, relstream's order on every row's true output length, in V1's "
        "batches: the best order that keeps V1's throughput."
    )
    body = [
        "## Targets, judged on every seed",
        "",
        *markdown_verdicts(verdicts),
        "",
        "## Per profile, arrival process and load (mean over seeds, [min-max])",
        "",
        *markdown_table(records),
        "",
        "![mean latency over v1-fcfs's](mean_vs_load.png)",
        "",
    ]
    deadlines = markdown_deadlines(records)
    if deadlines:
        setting += (
            f" Deadlines: each relQuery due {options.deadlines:g}x its latency alone (stock "
            "V1, empty engine) after its arrival; stock V1 ignores them, "
            "relstream-no-deadlines is relstream blind to them."
        )
        body += [
            "## Deadline attainment (share of relQueries answered by their deadline; mean "
            "over seeds, [min – max])",
            "",
            *deadlines,
            "",
        ]
    write_report(
        out, "Sustained load: long traces near capacity (simulator)", document, setting, body
    )
    return verdicts
