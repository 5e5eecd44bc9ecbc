"""`relstream drill flood`: a hostile producer's flood against a running pipeline."""

from __future__ import annotations

import shlex
import sys
import tempfile
from pathlib import Path

import click

from relstream.cli.common import console, csv_of


@click.group()
def drill() -> None:
    """Drills: what a pipeline does under hostile input."""


@drill.command()
@click.option("--count", default=10_000, show_default=True, help="Bad messages per run.")
@click.option(
    "--seeds",
    default="0,1,2",
    show_default=True,
    callback=csv_of(int),
    help="One run per seed.",
)
@click.option("--big-each", default=5, show_default=True, help="Messages of each 5 MB kind.")
@click.option("--valid-relqueries", default=50, show_default=True)
@click.option("--valid-rows", default=200, show_default=True)
@click.option("--timeout", default=900.0, show_default=True, help="Seconds per run.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the tables, the command and the machine to this markdown file.",
)
def flood(
    count: int,
    seeds: tuple[int, ...],
    big_each: int,
    valid_relqueries: int,
    valid_rows: int,
    timeout: float,
    out: Path | None,
) -> None:
    """Flood a broker, worker and engine (sim backend) with bad messages of every kind
    while valid relQueries stream through; per kind: sent, dead-lettered, first reason."""
    from relstream.bench.flood import report_table, run_flood
    from relstream.bench.report import machine_description
    from relstream.kafka.brokers import EmbeddedBroker

    sections = [
        "# Flood drill",
        "",
        f"Command: `relstream {shlex.join(sys.argv[1:])}`",
        "",
        f"Machine: {machine_description()}. Broker: Tansu (embedded); engine: sim backend.",
    ]
    failed = []
    for seed in seeds:
        workdir = Path(tempfile.mkdtemp(prefix=f"relstream-flood-{seed}-"))
        console.print(f"seed {seed}: {count} bad messages; logs in {workdir}")
        with EmbeddedBroker("tansu", data_dir=workdir / "broker") as broker:
            report = run_flood(
                broker, workdir, count, seed, big_each, valid_relqueries, valid_rows, timeout
            )
        table = report_table(report)
        console.print(table, markup=False)
        sections += ["", f"## Seed {seed}: {'holds' if report.holds else 'FAILS'}", "", table]
        if not report.holds:
            failed.append(seed)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(sections) + "\n")
        console.print(f"wrote {out}")
    if failed:
        raise click.ClickException(f"the drill failed for seed(s) {failed}")
