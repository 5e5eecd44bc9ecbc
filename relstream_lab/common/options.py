"""What the lab's commands share: the paper's trace options, the recorded command, the
latency table printed at the end of a run."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import click
from rich.table import Table

from relstream.cli.common import console, csv_list
from relstream_lab.common.workload import DEFAULT_DATASETS_DIR, TraceConfig
from relstream_lab.policies import SIM_POLICIES

datasets_option = click.option(
    "--datasets",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATASETS_DIR,
    show_default=True,
    help="Folder with the paper's tables; the bundled sample table is used if absent.",
)


def policies(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> tuple[str, ...] | None:
    if value is None:
        return None
    names = csv_list(str, value)
    unknown = [name for name in names if name not in SIM_POLICIES]
    if unknown:
        known = ", ".join(SIM_POLICIES)
        raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {known}")
    return names


def rates(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[float, ...]:
    """A click callback: comma-separated positive rates or loads."""
    values = csv_list(float, value)
    if any(rate <= 0 for rate in values):
        raise click.BadParameter("rates must be positive relQueries per second")
    return values


def trace_options(size: int):
    """The paper's trace (`size` relQueries of 1-`size` rows by default), the policies and
    the out folder: the options `bench paper`, `bench campaign` and `bench streaming` share."""
    options = (
        click.option("--policies", default=None, callback=policies, help="Comma-separated."),
        click.option("--relqueries", default=size, show_default=True, type=click.IntRange(1)),
        click.option("--max-rows", default=size, show_default=True, type=click.IntRange(1)),
        click.option("--arrival", type=click.Choice(["poisson", "gamma"]), default="poisson"),
        click.option("--burstiness", default=1.0, type=click.FloatRange(min=0.05), help="CV."),
        click.option("--seed", default=0, show_default=True),
        datasets_option,
        click.option("--bundled", is_flag=True, help="Use the bundled sample table only."),
        click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None),
    )

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def trace_of(opts: dict) -> tuple[TraceConfig, Path | None, dict]:
    """The trace, its tables' folder (None: the bundled table) and the trace's options as
    a recorded command spells them."""
    bundled = opts["bundled"] or not opts["datasets"].exists()
    if bundled and not opts["bundled"]:
        console.print(f"[yellow]{opts['datasets']} not found: using the bundled sample table[/]")
    trace = TraceConfig(
        num_relqueries=opts["relqueries"],
        max_rows=opts["max_rows"],
        arrival=opts["arrival"],
        burstiness=opts["burstiness"],
        seed=opts["seed"],
    )
    spelled = {
        "relqueries": opts["relqueries"],
        "max_rows": opts["max_rows"],
        "arrival": opts["arrival"],
        "burstiness": opts["burstiness"],
        "seed": opts["seed"],
        "datasets": "bundled" if bundled else os.path.relpath(opts["datasets"]),
    }
    return trace, None if bundled else opts["datasets"], spelled


def engine_options(command):
    """The real engine's model and the loads, as fractions of its measured capacity."""
    command = click.option(
        "--load",
        default="0.5,1.0,1.5",
        show_default=True,
        callback=rates,
        help="Comma-separated loads as fractions of the measured capacity.",
    )(command)
    return click.option("--model", default="smollm2", show_default=True, help="Name or HF folder.")(
        command
    )


def canonical_command(words: list[str], **options: object) -> str:
    """Every option spelled out, so the recorded command reproduces the run anywhere."""
    words = ["relstream-lab", *words]
    for name, value in options.items():
        if name == "datasets" and value == "bundled":
            words.append("--bundled")
        else:
            words += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(words)


def typed_command() -> str:
    """The command as it was typed, for a report to record."""
    return "relstream-lab " + shlex.join(sys.argv[1:])


def print_top_rate(document: dict, top: float) -> None:
    """Each policy's latency at the highest rate or load of a run."""
    table = Table(title=f"relQuery latency at load {top:g} (seconds)")
    columns = ("mean", "p50", "p99", "max", "waiting", "core", "tail")
    table.add_column("policy")
    for column in columns:
        table.add_column(column, justify="right")
    for run in document["runs"]:
        if run["rate"] == top:
            table.add_row(run["policy"], *(f"{run[k]:.2f}" for k in columns))
    console.print(table)
    decision = document.get("decision_benchmark")
    if decision:
        console.print(
            f"decision time, {decision['waiting_requests']} waiting / "
            f"{decision['running_requests']} running requests: median "
            f"{decision['median_us']:.0f} µs"
        )
