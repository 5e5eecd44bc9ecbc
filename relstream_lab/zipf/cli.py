"""`relstream-lab bench zipf`: a stream that repeats itself, with and without each mechanism
that cuts work (simulator)."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_of
from relstream_lab.common.options import datasets_option, typed_command


@click.command()
@click.option(
    "--profiles",
    default="cpu-smollm2,cpu-smollm2@16,a100-opt13b",
    show_default=True,
    callback=csv_of(str),
    help="Profile names or files; NAME@16 gives the profile KV blocks of 16 tokens.",
)
@click.option("--seeds", default="0,1,2", show_default=True, callback=csv_of(int))
@click.option("--load", default=0.95, show_default=True, help="Of stock V1's capacity.")
@click.option("--relqueries", default=300, show_default=True, type=click.IntRange(1))
@click.option("--max-rows", default=48, show_default=True, type=click.IntRange(1))
@click.option("--zipf-s", default=1.0, show_default=True, help="The Zipf law's exponent.")
@datasets_option
@click.option(
    "--backend",
    type=click.Choice(["sim", "vllm"]),
    default="sim",
    show_default=True,
    help="vllm: the real engine, one engine per variant (give fewer --relqueries).",
)
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1))
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("out/benchmarks/zipf"),
    show_default=True,
)
def zipf(**opts) -> None:
    """Catalogue enrichment over ratebeer.csv, beers drawn by a Zipf law: stock V1 against
    relstream with rows in prompt order, identical requests computed once and the answer
    cache, at a fraction of stock V1's capacity."""
    from relstream_lab.zipf.report import write_report
    from relstream_lab.zipf.sim import TABLE, ZipfOptions, run_zipf

    if not (opts["datasets"] / TABLE).is_file():
        raise click.BadParameter(f"{opts['datasets'] / TABLE} not found", param_hint="--datasets")
    options = ZipfOptions(
        datasets_dir=opts["datasets"],
        profiles=opts["profiles"],
        seeds=opts["seeds"],
        load=opts["load"],
        relqueries=opts["relqueries"],
        max_rows=opts["max_rows"],
        zipf_s=opts["zipf_s"],
        workers=opts["workers"],
    )
    command = typed_command()
    if opts["backend"] == "vllm":
        _real(options, opts["out"], command)
        return
    jobs = len(options.profiles) * len(options.seeds)
    done = []

    def report(records: list[dict]) -> None:
        done.append(records)
        console.print(f"{records[0]['profile']} seed {records[0]['seed']}: {len(done)}/{jobs}")

    records = run_zipf(options, report)
    described = (
        f"{options.relqueries} relQueries of 1-{options.max_rows} rows a trace, Poisson "
        f"arrivals at {options.load:g} of stock V1's capacity, Zipf s = {options.zipf_s:g}, "
        f"seeds {', '.join(map(str, options.seeds))}; each cell: mean over seeds [min-max]."
    )
    write_report(records, opts["out"], command, described)
    console.print(f"wrote {opts['out']}/README.md")


def _real(options, out: Path, command: str) -> None:
    from relstream_lab.common.report import machine_description
    from relstream_lab.zipf.real import run_real, write_real_report

    records = []
    for seed in options.seeds:
        records += run_real(options, seed, console.print)
    write_real_report(records, out, command, machine_description())
    console.print(f"wrote {out}/README.md")
