"""`relstream-lab bench fairshare`: two backlogged queries' shares of the engine."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_list, csv_of
from relstream_lab.common.options import canonical_command, datasets_option


def _rows(_ctx, _param, value: str) -> tuple[int, int]:
    low, _, high = value.partition("-")
    try:
        rows = (int(low), int(high or low))
    except ValueError:
        raise click.BadParameter(f"{value!r}: rows as LOW-HIGH, e.g. 40-60") from None
    if not 1 <= rows[0] <= rows[1]:
        raise click.BadParameter(f"{value!r}: rows as LOW-HIGH with 1 <= LOW <= HIGH")
    return rows


@click.command("fairshare")
@click.option("--profiles", default="cpu-smollm2,a100-opt13b", show_default=True,
              callback=lambda _c, _p, v: csv_list(str, v),
              help="Comma-separated simulator profiles: names or profile files.")  # fmt: skip
@click.option("--seeds", default="0,1,2", show_default=True, callback=csv_of(int))
@click.option("--heavy-rows", default="40-60", show_default=True, callback=_rows)
@click.option("--light-rows", default="1-10", show_default=True, callback=_rows)
@click.option("--load", default=0.75, show_default=True, type=click.FloatRange(0.1, 5.0),
              help="Each query's rate: a share of what the engine serves of it alone.")  # fmt: skip
@click.option("--minutes", default=10.0, show_default=True, type=click.FloatRange(0.5, 120))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1))
@datasets_option
@click.option("--bundled", is_flag=True, help="Use the bundled sample table only.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/benchmarks/sim-fairshare"), show_default=True)  # fmt: skip
@click.option("--report-only", is_flag=True,
              help="Rebuild README.md from --out's results.json (notes.md edited).")  # fmt: skip
def fairshare(**opts) -> None:
    """A heavy and a light query, both backlogged: the engine's tokens each gets, with
    relstream's fair share off and on, and stock V1 (simulator)."""
    from relstream_lab.fairshare.run import (
        VARIANTS,
        FairOptions,
        rebuild_report,
        run_fairshare,
        shares,
    )

    if opts["report_only"]:
        rebuild_report(opts["out"])
        console.print(f"wrote {opts['out']}/README.md")
        return
    command = canonical_command(
        ["bench", "fairshare"],
        profiles=",".join(opts["profiles"]),
        seeds=",".join(map(str, opts["seeds"])),
        heavy_rows="-".join(map(str, opts["heavy_rows"])),
        light_rows="-".join(map(str, opts["light_rows"])),
        load=opts["load"],
        minutes=opts["minutes"],
        datasets="bundled" if opts["bundled"] else "../shared/datasets",
        out=opts["out"],
    )
    options = FairOptions(
        tuple(opts["profiles"]), tuple(opts["seeds"]), opts["heavy_rows"], opts["light_rows"],
        opts["load"], opts["minutes"], None if opts["bundled"] else opts["datasets"],
        opts["out"], opts["workers"], command,
    )  # fmt: skip

    def on_cell(records: list[dict]) -> None:
        for r in records:
            heavy = {label: f"{shares(r, label)['heavy']:.1%}" for label in VARIANTS}
            console.print(f"{r['profile']} seed {r['seed']}: heavy's share {heavy}")

    run_fairshare(options, on_cell)
    console.print(f"wrote {opts['out']}/results.json, README.md")
