"""`relstream-lab bench idle`: the walkthrough's pipeline with nothing flowing, per process."""

from __future__ import annotations

import json
from pathlib import Path

import click

from relstream.cli.common import console, csv_of
from relstream_lab.common.options import typed_command


@click.command()
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1))
@click.option(
    "--seconds", default=60.0, show_default=True, type=click.FloatRange(1), help="Idle spell."
)
@click.option(
    "--settle",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0),
    help="Seconds after every process is ready before the spell starts.",
)
@click.option(
    "--brokers",
    default="kafka,tansu",
    show_default=True,
    callback=csv_of(str),
    help="kafka: `relstream broker`; tansu: `relstream broker --memory`.",
)
@click.option(
    "--rows",
    default=0,
    show_default=True,
    type=click.IntRange(0),
    help="Rows sent through the pipeline (and answered) before the idle spell.",
)
@click.option(
    "--rounds",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Send --rows in this many rounds, each timed from its first row produced to its "
    "last answered, with the MB the broker wrote in it; a JSONL sink follows the results.",
)
@click.option(
    "--report-only",
    is_flag=True,
    help="Rewrite README.md from --out's results.json (and notes.md) without running.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("docs/benchmarks/idle"),
    show_default=True,
)
def idle(runs, seconds, settle, brokers, rows, rounds, report_only, out):
    """The README walkthrough's broker, worker and engine (sim) idle: CPU per process."""
    from relstream_lab.common.report import machine_description
    from relstream_lab.idle.report import markdown, show
    from relstream_lab.idle.run import idle_runs

    if report_only:
        document = json.loads((out / "results.json").read_text())
    else:
        records = idle_runs(list(brokers), runs, seconds, settle, show, rows, rounds)
        document = {"command": typed_command(), "machine": machine_description(), "runs": records}
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(document, indent=1))
    lines = markdown(document)
    notes = out / "notes.md"  # the hand-written analysis, kept across re-runs
    if notes.exists():
        lines += ["## Notes", "", notes.read_text().strip(), ""]
    (out / "README.md").write_text("\n".join(lines))
    console.print(f"wrote {out / 'README.md'}")
