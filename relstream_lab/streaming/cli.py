"""`relstream-lab bench streaming`: what the streaming path costs beside a direct run;
`bench faust-agent`: the window stage as a Faust agent against the real one."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_list, unwind_on_sigterm
from relstream.engine.cpu import reexec_with_tcmalloc
from relstream.kafka.tools.brokers import BROKERS, DEFAULT_BROKER
from relstream.scheduler import DEFAULT_POLICY
from relstream_lab.common.options import canonical_command, engine_options, trace_of, trace_options


def _positive_ints(value: str) -> tuple[int, ...]:
    counts = csv_list(int, value)
    if min(counts) < 1:
        raise click.BadParameter(f"counts must be at least 1, got {value}")
    return counts


@click.command()
@engine_options
@click.option(
    "--rows",
    default=100_000,
    show_default=True,
    type=click.IntRange(1000),
    help="Rows produced live for the window throughput measure.",
)
@click.option(
    "--repeats",
    default="2",
    show_default=True,
    callback=lambda _c, _p, v: _positive_ints(v),
    help="Kafka runs per load, each followed by a direct run; one count for every load, "
    "or comma-separated, one per load.",
)
@click.option(
    "--broker",
    type=click.Choice(BROKERS),
    default=DEFAULT_BROKER,
    show_default=True,
    help="The embedded broker.",
)
@trace_options(size=24)
def streaming(**opts) -> None:
    """Serve the trace through Kafka and directly at each load; time the window stage."""
    if len(opts["repeats"]) not in (1, len(opts["load"])):
        raise click.BadParameter(
            f"give one count or one per load ({len(opts['load'])})", param_hint="--repeats"
        )
    policy = opts["policies"][0] if opts["policies"] else DEFAULT_POLICY
    trace, datasets_dir, spelled = trace_of(opts)
    command = canonical_command(
        ["bench", "streaming"],
        model=opts["model"],
        policies=policy,
        load=",".join(f"{r:g}" for r in opts["load"]),
        rows=opts["rows"],
        broker=opts["broker"],
        repeats=",".join(map(str, opts["repeats"])),
        **spelled,
    )
    reexec_with_tcmalloc()
    unwind_on_sigterm()
    from relstream_lab.streaming.report import write_stream_report
    from relstream_lab.streaming.run import StreamBenchOptions, run_stream_benchmark

    out_dir = opts["out"] or Path("docs/benchmarks") / "streaming"
    options = StreamBenchOptions(
        model=opts["model"],
        policy=policy,
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


@click.command("faust-agent")
@click.option(
    "--stream-python",
    required=True,
    help="The worker environment's Python (.venv-stream/bin/python).",
)
@click.option("--rows", default=100_000, show_default=True, help="Rows produced live per run.")
@click.option("--repeats", default=2, show_default=True, help="Runs of each worker, alternating.")
def faust_agent(stream_python: str, rows: int, repeats: int) -> None:
    """Can the window stage be a Faust agent? Rows/s and rows per CPU-second of the real
    window stage and of a Faust-agent prototype on one Tansu broker, as JSON on stdout."""
    from relstream_lab.streaming.faust_probe import measure

    measure(stream_python, rows, repeats)
