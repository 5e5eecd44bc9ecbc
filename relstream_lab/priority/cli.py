"""`relstream-lab bench priority`: live relQueries beside a backfill, in the simulator
or (`--backend vllm`) on the real engine."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_list, csv_of
from relstream_lab.common.options import canonical_command, datasets_option, policies


@click.command("priority")
@click.option("--profiles", default="cpu-smollm2,a100-opt13b", show_default=True,
              callback=lambda _c, _p, v: csv_list(str, v),
              help="Comma-separated simulator profiles: names or profile files.")  # fmt: skip
@click.option("--policies", default="relstream,v1-priority,v1-fcfs", show_default=True,
              callback=policies)  # fmt: skip
@click.option("--seeds", default="0,1,2,3,4", show_default=True, callback=csv_of(int))
@click.option("--backfill", default=100, show_default=True, type=click.IntRange(1),
              help="Backfill relQueries.")  # fmt: skip
@click.option("--backfill-rows", default=5000, show_default=True, type=click.IntRange(1),
              help="Backfill rows in all.")  # fmt: skip
@click.option("--live", default=1, show_default=True, type=click.IntRange(1),
              help="Live relQueries, spread over the backfill (1: the issue's case).")  # fmt: skip
@click.option("--live-max-rows", default=20, show_default=True, type=click.IntRange(1))
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1))
@datasets_option
@click.option("--bundled", is_flag=True, help="Use the bundled sample table only.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("docs/benchmarks/sim-priority"), show_default=True)  # fmt: skip
@click.option("--backend", type=click.Choice(["sim", "vllm"]), default="sim", show_default=True,
              help="vllm: the real engine under relstream, one live relQuery.")  # fmt: skip
@click.option("--model", default="smollm2", show_default=True, help="With --backend vllm.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1),
              help="With --backend vllm: runs of the live relQuery alone.")  # fmt: skip
@click.option("--report-only", is_flag=True,
              help="Rebuild README.md from --out's results.json (notes.md edited).")  # fmt: skip
def priority(**opts) -> None:
    """Live relQueries (class 0) beside a backfill (class -1): their latency against an
    idle engine's, the backfill's makespan, with and without classes (simulator)."""
    from relstream_lab.priority.run import PriorityOptions, rebuild_report, run_priority, summarize

    if opts["backend"] == "vllm":
        real(opts)
        return
    if opts["report_only"]:
        rebuild_report(opts["out"])
        console.print(f"wrote {opts['out']}/README.md")
        return
    command = canonical_command(
        ["bench", "priority"],
        profiles=",".join(opts["profiles"]),
        policies=",".join(opts["policies"]),
        seeds=",".join(map(str, opts["seeds"])),
        backfill=opts["backfill"],
        backfill_rows=opts["backfill_rows"],
        live=opts["live"],
        live_max_rows=opts["live_max_rows"],
        datasets="bundled" if opts["bundled"] else "../shared/datasets",
        out=opts["out"],
    )
    options = PriorityOptions(
        tuple(opts["profiles"]), tuple(opts["policies"]), tuple(opts["seeds"]),
        opts["backfill"], opts["backfill_rows"], opts["live"], opts["live_max_rows"],
        None if opts["bundled"] else opts["datasets"], opts["out"], opts["workers"], command,
    )  # fmt: skip

    def on_cell(records: list[dict]) -> None:
        for record in records:
            ours = summarize(record, "classes")
            console.print(
                f"{record['profile']} seed {record['seed']} {record['policy']}: live "
                f"{ours['mean_ratio']:.2f}x mean, {ours['max_ratio']:.2f}x max; backfill "
                f"{ours['growth']:+.1%}"
            )

    run_priority(options, on_cell)
    console.print(f"wrote {opts['out']}/results.json, README.md")


def real(opts: dict) -> None:
    from relstream_lab.priority.real import rebuild_real_report, run_real

    if opts["report_only"]:
        rebuild_real_report(opts["out"])
        console.print(f"wrote {opts['out']}/README.md")
        return

    command = canonical_command(
        ["bench", "priority"],
        backend="vllm",
        model=opts["model"],
        seeds=",".join(map(str, opts["seeds"])),
        backfill=opts["backfill"],
        backfill_rows=opts["backfill_rows"],
        live_max_rows=opts["live_max_rows"],
        repeats=opts["repeats"],
        datasets="bundled" if opts["bundled"] else "../shared/datasets",
        out=opts["out"],
    )
    keys = ("model", "seeds", "backfill", "backfill_rows", "live_max_rows", "repeats")
    options = {key: opts[key] for key in keys}
    options["datasets_dir"] = None if opts["bundled"] else opts["datasets"]
    run_real(options, opts["out"], command, console.print)
    console.print(f"wrote {opts['out']}/results.json, README.md")
