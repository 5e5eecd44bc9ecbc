"""`relstream bench`: the benchmarks (simulator, real engine, streaming path)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click
from rich.table import Table

from relstream.cli.common import console, csv_list, progress, unwind_on_sigterm
from relstream.engine.cpu import reexec_with_tcmalloc
from relstream.extras import require
from relstream.kafka.brokers import BROKERS, DEFAULT_BROKER
from relstream.scheduler import DEFAULT_POLICY
from relstream.sim.profiles import PROFILE_NAMES
from relstream_lab.common.runner import RunSummary
from relstream_lab.common.workload import DEFAULT_DATASETS_DIR, TraceConfig
from relstream_lab.policies import SIM_POLICIES

datasets_option = click.option(
    "--datasets",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DATASETS_DIR,
    show_default=True,
    help="Folder with the paper's tables; the bundled sample table is used if absent.",
)


def _policies(
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


def _rates(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[float, ...]:
    rates = csv_list(float, value)
    if any(rate <= 0 for rate in rates):
        raise click.BadParameter("rates must be positive relQueries per second")
    return rates


@click.command()
@click.option(
    "--backend", type=click.Choice(["sim", "vllm", "streaming"]), default="sim", show_default=True
)
@click.option(
    "--profile", type=click.Choice(PROFILE_NAMES), default="a100-opt13b", show_default=True
)
@click.option("--model", default="smollm2", show_default=True, help="vllm: name or HF folder.")
@click.option("--policies", default=None, callback=_policies, help="Comma-separated policies.")
@click.option(
    "--rates",
    default="0.25,0.5,0.75,1.0,1.25,1.5,2.0",
    show_default=True,
    callback=_rates,
    help="sim: comma-separated relQuery arrival rates (relQueries/s).",
)
@click.option(
    "--load",
    default="0.5,1.0,1.5",
    show_default=True,
    callback=_rates,
    help="vllm, streaming: comma-separated loads as fractions of the measured capacity.",
)
@click.option("--relqueries", default=None, type=click.IntRange(1), help="[sim 100, vllm 24]")
@click.option("--max-rows", default=None, type=click.IntRange(1), help="[sim 100, vllm 24]")
@click.option("--arrival", type=click.Choice(["poisson", "gamma"]), default="poisson")
@click.option("--burstiness", default=1.0, type=click.FloatRange(min=0.05), help="Gamma CV.")
@click.option("--seed", default=0, show_default=True)
@click.option("--cost-model", type=click.Choice(["online", "fixed"]), default="online")
@datasets_option
@click.option("--bundled", is_flag=True, help="Use the bundled sample table only.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None)
@click.option("--decision-benchmark/--no-decision-benchmark", default=True)
@click.option(
    "--seeds",
    default=None,
    callback=lambda _c, _p, v: csv_list(int, v) if v else None,
    help="vllm: comma-separated trace seeds [--seed].",
)
@click.option(
    "--seeded-loads",
    default="",
    callback=lambda _c, _p, v: csv_list(float, v) if v else (),
    help="vllm: loads run on every seed (the others on the first seed only).",
)
@click.option(
    "--arrivals",
    default=None,
    callback=lambda _c, _p, v: csv_list(str, v) if v else None,
    help="vllm: comma-separated arrival processes, poisson and/or gamma [--arrival].",
)
@click.option("--resume", is_flag=True, help="vllm: keep the runs already checkpointed in --out.")
@click.option(
    "--report-only",
    is_flag=True,
    help="vllm: rebuild the report (fit, simulator replay, README) from the campaign "
    "checkpoint already in --out, without running the engine.",
)
@click.option(
    "--rows",
    default=100_000,
    show_default=True,
    type=click.IntRange(1000),
    help="streaming: rows produced live for the window throughput measure.",
)
@click.option(
    "--repeats",
    default="2",
    show_default=True,
    callback=lambda _c, _p, v: _positive_ints(v),
    help="streaming: Kafka runs per load, each followed by a direct run; one count for "
    "every load, or comma-separated, one per load.",
)
@click.option(
    "--broker",
    type=click.Choice(BROKERS),
    default=DEFAULT_BROKER,
    show_default=True,
    help="streaming: the embedded broker.",
)
def bench(**opts) -> None:
    """Replay the paper's relQuery trace under each policy and load."""
    require("lab")
    backend = opts["backend"]
    default_size = 100 if backend == "sim" else 24
    opts["relqueries"] = opts["relqueries"] or default_size
    opts["max_rows"] = opts["max_rows"] or default_size
    if opts["policies"] is None:
        stock_and_ours = ("v1-fcfs", "v1-priority", "relserve", DEFAULT_POLICY)
        defaults = {"sim": SIM_POLICIES, "vllm": stock_and_ours}
        opts["policies"] = defaults.get(backend, (DEFAULT_POLICY,))
    bundled = _use_bundled(opts["bundled"], opts["datasets"])
    if bundled and not opts["bundled"]:
        console.print(f"[yellow]{opts['datasets']} not found: using the bundled sample table[/]")
    trace = TraceConfig(
        num_relqueries=opts["relqueries"],
        max_rows=opts["max_rows"],
        arrival=opts["arrival"],
        burstiness=opts["burstiness"],
        seed=opts["seed"],
    )
    command = _canonical_command(
        backend=backend,
        **({"profile": opts["profile"]} if backend == "sim" else {"model": opts["model"]}),
        policies=",".join(opts["policies"]),
        **(
            {"rates": ",".join(f"{r:g}" for r in opts["rates"]), "cost_model": opts["cost_model"]}
            if backend == "sim"
            else {"load": ",".join(f"{r:g}" for r in opts["load"])}
        ),
        **(
            {
                "rows": opts["rows"],
                "broker": opts["broker"],
                "repeats": ",".join(map(str, opts["repeats"])),
            }
            if backend == "streaming"
            else {}
        ),
        **(_campaign_options(opts) if backend == "vllm" else {}),
        relqueries=opts["relqueries"],
        max_rows=opts["max_rows"],
        arrival=opts["arrival"],
        burstiness=opts["burstiness"],
        seed=opts["seed"],
        datasets="bundled" if bundled else os.path.relpath(opts["datasets"]),
    )
    datasets_dir = None if bundled else opts["datasets"]
    if backend == "sim":
        _bench_sim(opts, trace, datasets_dir, command)
    elif backend == "vllm":
        _bench_vllm(opts, trace, datasets_dir, command)
    else:
        _bench_streaming(opts, trace, datasets_dir, command)


def _bench_sim(opts: dict, trace: TraceConfig, datasets_dir: Path | None, command: str) -> None:
    from relstream_lab.paper.run import SimBenchOptions, run_sim_benchmark

    out_dir = opts["out"] or Path("docs/benchmarks") / f"sim-{opts['profile']}"
    options = SimBenchOptions(
        profile=opts["profile"],
        policies=opts["policies"],
        rates=opts["rates"],
        trace=trace,
        datasets_dir=datasets_dir,
        out_dir=out_dir,
        cost_model=opts["cost_model"],
        decision_benchmark=opts["decision_benchmark"],
        command=command,
    )
    with progress() as bar:
        task = bar.add_task("tokenizing trace", total=len(options.policies) * len(options.rates))

        def on_trace(count: int, requests: int) -> None:
            bar.update(task, description=f"simulating {count} relQueries ({requests} requests)")

        def on_run(summary: RunSummary) -> None:
            bar.advance(task)
            bar.console.print(
                f"  {summary.policy:<12} rate {summary.rate:<5g} mean {summary.mean:8.2f} s"
            )

        document = run_sim_benchmark(options, on_trace, on_run)
    _print_top_rate(document, document["top_rate"])
    console.print(f"wrote {out_dir}/results.json, latency_vs_rate.png, breakdown.png, README.md")


def _campaign_options(opts: dict) -> dict:
    """The campaign's own options, filled from the single-trace ones when not given."""
    opts["seeds"] = opts["seeds"] or (opts["seed"],)
    opts["arrivals"] = opts["arrivals"] or (opts["arrival"],)
    unknown = set(opts["arrivals"]) - {"poisson", "gamma"}
    if unknown:
        raise click.BadParameter(f"unknown {', '.join(sorted(unknown))}", param_hint="--arrivals")
    return {
        "seeds": ",".join(str(seed) for seed in opts["seeds"]),
        "seeded_loads": ",".join(f"{load:g}" for load in opts["seeded_loads"]),
        "arrivals": ",".join(opts["arrivals"]),
    }


def _bench_vllm(opts: dict, trace: TraceConfig, datasets_dir: Path | None, command: str) -> None:
    from relstream_lab.campaign.report import save_campaign, write_vllm_report

    out_dir = opts["out"] or Path("docs/benchmarks") / "vllm-cpu-smollm2"
    if not opts["report_only"]:
        reexec_with_tcmalloc()
        unwind_on_sigterm()
        from relstream_lab.campaign.checkpoint import MachineSpeedError
        from relstream_lab.campaign.run import VllmBenchOptions, run_vllm_benchmark, runs_to_do

        options = VllmBenchOptions(
            model=opts["model"],
            policies=opts["policies"],
            load_fractions=opts["load"],
            trace=trace,
            datasets_dir=datasets_dir,
            out_dir=out_dir,
            command=command,
            seeds=opts["seeds"],
            seeded_loads=opts["seeded_loads"],
            arrivals=opts["arrivals"],
            burstiness=opts["burstiness"],
            resume=opts["resume"],
        )
        with progress() as bar:
            task = bar.add_task(
                "machine speed, capacity if new (stock vLLM, whole trace at once)",
                total=runs_to_do(options) + 1,
            )

            def on_run(message: str) -> None:
                bar.advance(task)
                bar.update(task, description=message)
                bar.console.print(f"  {message}")

            if not options.resume or not (out_dir / "campaign.json").exists():
                out_dir.mkdir(parents=True, exist_ok=True)
                save_campaign(options)
            try:
                run_vllm_benchmark(options, on_run)
            except MachineSpeedError as error:
                raise click.ClickException(str(error)) from error
    document = write_vllm_report(out_dir, datasets_dir)
    _print_top_rate(document, max(run["rate"] for run in document["runs"]))
    console.print(f"wrote {out_dir}/results.json, README.md, plots, {out_dir.name} checkpoint")


def _bench_streaming(
    opts: dict, trace: TraceConfig, datasets_dir: Path | None, command: str
) -> None:
    reexec_with_tcmalloc()
    unwind_on_sigterm()
    from relstream_lab.streaming.report import write_stream_report
    from relstream_lab.streaming.run import StreamBenchOptions, run_stream_benchmark

    out_dir = opts["out"] or Path("docs/benchmarks") / "streaming"
    if len(opts["repeats"]) not in (1, len(opts["load"])):
        raise click.BadParameter(
            f"give one count or one per load ({len(opts['load'])})", param_hint="--repeats"
        )
    options = StreamBenchOptions(
        model=opts["model"],
        policy=opts["policies"][0] if opts["policies"] else DEFAULT_POLICY,
        loads=tuple(opts["load"]),
        trace=trace,
        datasets_dir=datasets_dir,
        throughput_rows=opts["rows"],
        out_dir=out_dir,
        broker=opts["broker"],
        command=command,
        repeats=opts["repeats"],
    )
    document = run_stream_benchmark(
        options,
        lambda message: console.print(f"  {message}"),
        lambda partial: write_stream_report(partial, out_dir),
    )
    overheads = ", ".join(
        f"{run['kafka_overhead']:+.1%} at {run['load']:g}" for run in document["loads"]
    )
    console.print(
        f"Kafka overhead {overheads}; window stage "
        f"{document['window_throughput']['rows_per_second']:,.0f} rows/s; wrote {out_dir}"
    )


def _positive_ints(value: str) -> tuple[int, ...]:
    counts = csv_list(int, value)
    if min(counts) < 1:
        raise click.BadParameter(f"counts must be at least 1, got {value}")
    return counts


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


def _print_top_rate(document: dict, top: float) -> None:
    table = Table(title=f"relQuery latency at load {top:g} (seconds)")
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
