"""`relstream-lab bench placement`: hash, load-aware and pooled placement over simulated engines."""

from __future__ import annotations

import json
from pathlib import Path

import click

from relstream.cli.common import console, csv_of
from relstream_lab.common.options import datasets_option, typed_command


@click.command()
@click.option("--engines", default="4,8", show_default=True, callback=csv_of(int))
@click.option("--arrivals", default="poisson,gamma", show_default=True, callback=csv_of(str))
@click.option("--seeds", default="0,1,2", show_default=True, callback=csv_of(int))
@click.option("--loads", default="0.7,0.9", show_default=True, callback=csv_of(float))
@click.option("--per-engine", default=150, show_default=True, type=click.IntRange(1))
@click.option("--profile", default="a100-opt13b", show_default=True)
@click.option("--report-s", default=0.25, show_default=True, help="Seconds between reports.")
@datasets_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("docs/benchmarks/placement"),
    show_default=True,
)
def placement(engines, arrivals, seeds, loads, per_engine, profile, report_s, datasets, out):
    """Place relQueries on E simulated engines by hash, by reported load and from one pool."""
    from relstream_lab.common.report import machine_description
    from relstream_lab.placement.run import PlacementOptions, markdown, run_placement

    options = PlacementOptions(
        tuple(engines),
        tuple(arrivals),
        2.0,
        tuple(seeds),
        tuple(loads),
        per_engine,
        48,
        profile,
        report_s,
        datasets if datasets and Path(datasets).is_dir() else None,
    )
    records = run_placement(options)
    command = typed_command()
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"command": command, "runs": records}, indent=1))
    lines = markdown(records, command, machine_description())
    notes = out / "notes.md"  # the hand-written analysis, kept across re-runs
    if notes.exists():
        lines += ["## Notes", "", notes.read_text().strip(), ""]
    (out / "README.md").write_text("\n".join(lines))
    console.print(f"wrote {out / 'README.md'}")
