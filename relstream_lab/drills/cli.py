"""`relstream-lab drill ...`: a hostile producer's flood, a broker outage, processes
crashing, against a running pipeline."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import click

from relstream.cli.common import console, csv_of
from relstream.extras import require
from relstream_lab.common.options import typed_command

seeds_option = click.option(
    "--seeds", default="0,1,2", show_default=True, callback=csv_of(int), help="One run per seed."
)
out_option = click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the outcome, the command and the machine to this markdown file.",
)


@click.group()
def drill() -> None:
    """Drills: what a pipeline does under hostile input, broker outages and crashes."""
    require("lab", "broker")


@drill.command()
@click.option("--count", default=10_000, show_default=True, help="Bad messages per run.")
@seeds_option
@click.option("--big-each", default=5, show_default=True, help="Messages of each 5 MB kind.")
@click.option("--valid-relqueries", default=50, show_default=True)
@click.option("--valid-rows", default=200, show_default=True)
@click.option("--large", default=0, show_default=True, help="Valid relQueries of about 5 MB.")
@click.option("--large-rows", default=20_000, show_default=True, help="Rows of each of them.")
@click.option("--timeout", default=900.0, show_default=True, help="Seconds per run.")
@out_option
def flood(
    count: int,
    seeds: tuple[int, ...],
    big_each: int,
    valid_relqueries: int,
    valid_rows: int,
    large: int,
    large_rows: int,
    timeout: float,
    out: Path | None,
) -> None:
    """Flood a broker, worker and engine (sim backend) with bad messages of every kind
    while valid relQueries stream through; per kind: sent, dead-lettered, first reason;
    per process: RSS baseline, peak and growth."""
    from relstream.kafka.tools.brokers import EmbeddedBroker
    from relstream_lab.common.report import machine_description
    from relstream_lab.drills.flood import report_table, run_flood

    sections = [
        "# Flood drill",
        "",
        f"Command: `{typed_command()}`",
        "",
        f"Machine: {machine_description()}. Broker: Tansu (embedded); engine: sim backend.",
    ]

    def one(seed: int, workdir: Path) -> tuple[bool, str]:
        console.print(f"seed {seed}: {count} bad messages; logs in {workdir}")
        with EmbeddedBroker("tansu", data_dir=workdir / "broker") as broker:
            report = run_flood(
                broker, workdir, count, seed, big_each, valid_relqueries, valid_rows, timeout,
                large, large_rows,
            )  # fmt: skip
        return report.holds, report_table(report)

    _each_seed("flood", seeds, one, sections, out)


@drill.command()
@seeds_option
@click.option("--outage", default=60.0, show_default=True, help="Seconds the broker is down.")
@click.option("--rate", default=20.0, show_default=True, help="Rows per second, all along.")
@click.option("--timeout", default=300.0, show_default=True, help="Seconds to wait for results.")
@out_option
def outage(seeds: tuple[int, ...], outage: float, rate: float, timeout: float, out) -> None:
    """Stop the broker (Apache Kafka, on disk) mid-stream for --outage seconds and start it
    again while rows keep arriving; check every row is in exactly one stored result,
    nothing exits, and the engine paused and resumed (worker and sim engine)."""
    from relstream_lab.common.report import machine_description
    from relstream_lab.drills.outage import report_text, run_outage

    sections = [
        "# Broker-outage drill",
        "",
        f"Command: `{typed_command()}`",
        "",
        f"Machine: {machine_description()}. Broker: Apache Kafka (one KRaft node, on disk); "
        "engine: sim backend in real time.",
    ]

    def one(seed: int, workdir: Path) -> tuple[bool, str]:
        console.print(f"seed {seed}: broker down {outage:g} s mid-stream; logs in {workdir}")
        report = run_outage(workdir, seed, outage_s=outage, rate=rate, timeout=timeout)
        return report.holds, report_text(report)

    _each_seed("outage", seeds, one, sections, out)


@drill.command()
@seeds_option
@click.option(
    "--memory", is_flag=True, help="On the Tansu broker (no transactions, no broker restart)."
)
@click.option("--duration", default=60.0, show_default=True, help="Seconds the rows flow.")
@click.option("--rate", default=20.0, show_default=True, help="Rows per second.")
@click.option("--broker-down", default=5.0, show_default=True, help="Seconds the broker is down.")
@click.option(
    "--timeout",
    default=120.0,
    show_default=True,
    help="Seconds each wait may take: start-up, the rows' acknowledgements, the results.",
)
@click.option(
    "--serve-within",
    default=30.0,
    show_default=True,
    help="Seconds a process started anew may take to take work (its ready file).",
)
@click.option(
    "--engine-arg",
    "engine_args",
    multiple=True,
    help="An argument added to every engine's command (repeat for more).",
)
@click.option(
    "--network/--no-network",
    default=True,
    show_default=True,
    help="Also reset every process's broker connections, stall the broker, and revoke "
    "partitions while the broker stalls (commits in flight).",
)
@click.option("--stall", default=3.0, show_default=True, help="Seconds a broker stall lasts.")
@out_option
def crash(
    seeds: tuple[int, ...],
    memory: bool,
    duration: float,
    rate: float,
    broker_down: float,
    timeout: float,
    serve_within: float,
    engine_args: tuple[str, ...],
    network: bool,
    stall: float,
    out: Path | None,
) -> None:
    """While rows flow, SIGKILL and restart each of two engines (sim backend, one group)
    with the same command, let a third join and leave, SIGKILL and restart the worker,
    stop and start the broker (Apache Kafka, on disk), reset every process's connections,
    stall the broker and let a fourth engine join during a stall; check a read_committed
    reader sees one result per relQuery and each row once, every result within 30 s of
    its completion, and every process serves again."""
    from relstream_lab.common.report import machine_description
    from relstream_lab.drills.crash import Settings, run_crash
    from relstream_lab.drills.crash_report import report_text

    settings = Settings(
        memory, duration, rate, broker_down, timeout=timeout, serve_within=serve_within,
        engine_args=engine_args, network=network, stall_s=stall,
    )  # fmt: skip
    broker = "Tansu (embedded, in memory)" if memory else "Apache Kafka (one KRaft node, on disk)"
    sections = [
        "# Crash drill",
        "",
        f"Command: `{typed_command()}`",
        "",
        f"Machine: {machine_description()}. Broker: {broker}; engines: sim backend in real time.",
    ]

    def one(seed: int, workdir: Path) -> tuple[bool, str]:
        console.print(f"seed {seed}: rows for {duration:g} s, faults; logs in {workdir}")
        report = run_crash(workdir, seed, settings)
        return report.holds, report_text(report)

    _each_seed("crash", seeds, one, sections, out)


def _each_seed(
    kind: str,
    seeds: tuple[int, ...],
    run: Callable[[int, Path], tuple[bool, str]],
    sections: list[str],
    out: Path | None,
) -> None:
    """`run(seed, workdir)` for each seed in a fresh folder: its outcome printed and added
    to `sections`, written to `out` if given; fails naming the seeds whose drill failed."""
    failed = []
    for seed in seeds:
        holds, text = run(seed, Path(tempfile.mkdtemp(prefix=f"relstream-{kind}-{seed}-")))
        console.print(text, markup=False)
        sections += ["", f"## Seed {seed}: {'holds' if holds else 'FAILS'}", "", text]
        if not holds:
            failed.append(seed)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(sections) + "\n")
        console.print(f"wrote {out}")
    if failed:
        raise click.ClickException(f"the drill failed for seed(s) {failed}")
