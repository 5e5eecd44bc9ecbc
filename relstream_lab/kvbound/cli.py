"""`relstream-lab bench kv-bound`: long outputs where KV binds, in the simulator."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_list, csv_of
from relstream_lab.common.options import canonical_command, datasets_option, policies, rates

POLICIES = "relstream,v1-fcfs,v1-priority,clairvoyant"


def _profiles(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    """Profile names or files, each checked as `bench sustained` reads it (`load_profile`)."""
    from relstream_lab.sustained.run import load_profile

    names = csv_list(str, value)
    for name in names:
        try:
            load_profile(name)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return names


def _outputs(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, int]:
    try:
        low, high = (int(part) for part in value.split("-"))
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected LOW-HIGH tokens, e.g. 256-512") from None
    if not 1 <= low <= high:
        raise click.BadParameter(f"{value!r}: expected 1 <= LOW <= HIGH")
    return low, high


@click.command("kv-bound")
@click.option("--profiles", default="a100-opt13b,h100-llama8b", show_default=True,
              callback=_profiles,
              help="Comma-separated simulator profiles: names or profile files.")  # fmt: skip
@click.option("--policies", default=POLICIES, show_default=True, callback=policies)
@click.option("--loads", default="0.75,1,1.1", show_default=True, callback=rates,
              help="Comma-separated loads, fractions of each trace's capacity.")  # fmt: skip
@click.option("--seeds", default="0,1,2", show_default=True, callback=csv_of(int))
@click.option("--outputs", default="256-512", show_default=True, callback=_outputs,
              help="Each row's output: uniform in LOW-HIGH tokens (budget HIGH).")  # fmt: skip
@click.option("--relqueries", default=100, show_default=True, type=click.IntRange(1))
@click.option("--max-rows", default=100, show_default=True, type=click.IntRange(1))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1))
@datasets_option
@click.option("--bundled", is_flag=True, help="Use the bundled sample table only.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/benchmarks/sim-kv-bound"), show_default=True)  # fmt: skip
@click.option("--report-only", is_flag=True,
              help="Rebuild README.md from --out's results.json (notes.md edited).")  # fmt: skip
def kv_bound(**opts) -> None:
    """Long outputs where KV binds: relstream against stock V1 and the clairvoyant
    reference at loads around the capacity (simulator)."""
    from relstream_lab.common.workload import TraceConfig
    from relstream_lab.kvbound.run import KvBoundOptions, rebuild_report, run_kv_bound

    if opts["report_only"]:
        rebuild_report(opts["out"])
        console.print(f"wrote {opts['out']}/README.md")
        return

    low, high = opts["outputs"]
    trace = TraceConfig(
        num_relqueries=opts["relqueries"], max_rows=opts["max_rows"], outputs=(low, high)
    )
    datasets_dir = None if opts["bundled"] else opts["datasets"]
    command = canonical_command(
        ["bench", "kv-bound"],
        profiles=",".join(opts["profiles"]),
        policies=",".join(opts["policies"]),
        loads=",".join(f"{load:g}" for load in opts["loads"]),
        seeds=",".join(map(str, opts["seeds"])),
        outputs=f"{low}-{high}",
        relqueries=opts["relqueries"],
        max_rows=opts["max_rows"],
        datasets="bundled" if opts["bundled"] else "../shared/datasets",
        out=opts["out"],
    )
    options = KvBoundOptions(
        opts["profiles"], tuple(opts["policies"]), opts["loads"], tuple(opts["seeds"]), trace,
        datasets_dir, opts["out"], opts["workers"], command,
    )  # fmt: skip

    def on_cell(records: list[dict]) -> None:
        first = records[0]
        console.print(f"{first['profile']} seed {first['seed']}: {len(records)} runs")

    document = run_kv_bound(options, on_cell)
    for verdict in document["verdicts"]:
        mark = "holds" if verdict["holds"] else "MISSED"
        console.print(
            f"{verdict['profile']}: {verdict['line']}: {verdict['worst_seed']:.3f} "
            f"({verdict['bound']}) {mark}"
        )
    console.print(f"wrote {opts['out']}/results.json, README.md")
