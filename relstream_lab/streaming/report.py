"""The streaming benchmark's report: results.json, a plot of mean latency straight to
the engine against through Kafka at each load, and README.md."""

from __future__ import annotations

from pathlib import Path

from relstream.kafka.tools.brokers import DEFAULT_BROKER
from relstream_lab.streaming.overhead import Overhead, paired_overhead

OVERHEAD_GOAL = 0.05  # the bound on what Kafka adds to mean latency


def write_stream_report(document: dict, out: Path) -> None:
    from relstream_lab.common.report import machine_description, write_report

    document = {**document, "machine": machine_description()}
    _plot(document["loads"], out / "overhead.png")
    setting = (
        f"Broker: embedded {document['broker']}; engine: vLLM CPU build, "
        f"{document['model']}, policy {document['policy']}."
    )
    write_report(out, "Streaming benchmark", document, setting, _body(document))


def _plot(loads: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    width = 0.38
    for shift, key, label in (
        (-width / 2, "mean_latency_direct_s", "straight to the engine"),
        (width / 2, "mean_latency_kafka_s", "through Kafka"),
    ):
        ax.bar([i + shift for i in range(len(loads))], [r[key] for r in loads], width, label=label)
    ax.set_xticks(range(len(loads)), [f"load {r['load']:g}" for r in loads])
    ax.set_ylabel("mean relQuery latency (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _runs(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def _overhead_of(run: dict) -> Overhead:
    """The paired overhead, from the mean latency of each run at one load."""
    return paired_overhead(run["mean_latency_direct_runs_s"], run["mean_latency_kafka_runs_s"])


def _overhead(run: dict) -> str:
    """The paired overhead and its 95 % interval, if there are two Kafka runs or more."""
    overhead = _overhead_of(run)
    if overhead.high is None:
        return f"{overhead.mean:+.1%}"
    return f"{overhead.mean:+.1%} ({overhead.low:+.1%} to {overhead.high:+.1%})"


def _verdicts(loads: list[dict]) -> list[str]:
    lines = []
    for run in loads:
        overhead = _overhead_of(run)
        mean_holds = "under" if overhead.mean < OVERHEAD_GOAL else "over"
        whole = overhead.established_below(OVERHEAD_GOAL)
        paired = ", ".join(f"{value:+.1%}" for value in overhead.paired)
        added = ", ".join(f"{value:+.2%}" for value in run["kafka_added_share_runs"])
        lines.append(
            f"- Load {run['load']:g}: paired overheads {paired} (each Kafka run against the "
            f"mean of the direct runs beside it); their mean is {mean_holds} the 5 % goal, "
            f"and its 95 % interval {'lies' if whole else 'does not lie'} wholly under it. "
            "Inside each Kafka run, the time Kafka itself adds (produced → taken by the "
            f"engine, plus result published → consumed) over the engine's own latency: {added}."
        )
    return lines


def _missing(document: dict) -> list[str]:
    done = {run["load"] for run in document["loads"]}
    missing = [load for load in document["loads_planned"] if load not in done]
    if not missing:
        return []
    loads = ", ".join(f"{load:g}" for load in missing)
    return [f"**Not run yet:** load {loads} (not finished when this report was written).", ""]


def _body(document: dict) -> list[str]:
    loads = document["loads"]
    throughput = document["window_throughput"]
    at_rest = document["rss_at_rest_mb"]
    return [
        "| load | direct: mean (runs) | spread | through Kafka: mean (runs) | spread | "
        "overhead, 95 % interval (goal < 5 %) | peak backlog (relQueries) | "
        "peak engine RSS |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {r['load']:g} | {r['mean_latency_direct_s']:.2f} s "
            f"({_runs(r['mean_latency_direct_runs_s'])}) | {r['direct_run_spread']:.1%} | "
            f"{r['mean_latency_kafka_s']:.2f} s ({_runs(r['mean_latency_kafka_runs_s'])}) | "
            f"{r['kafka_run_spread']:.1%} | {_overhead(r)} | "
            f"{r['peak_backlog_relqueries']} | {r['peak_rss_mb']:,.0f} MB "
            f"({r['peak_rss_mb'] - at_rest:+,.0f} MB over the engine at rest) |"
            for r in loads
        ],
        "",
        *_verdicts(loads),
        "",
        *_missing(document),
        f"Engine RSS at rest (warmed, before the first run): {at_rest:,.0f} MB; the cap under "
        f"load is that plus {document['rss_cap_mb'] - at_rest:,.0f} MB, "
        f"{document['rss_cap_mb']:,.0f} MB. At rest the CPU "
        "build holds its KV cache, the model's float32 weights and two processes' runtimes; "
        "the row budget bounds what the backlog adds.",
        "",
        f"Window → relQuery stage: **{throughput['rows_per_second']:,.0f} rows/s** (goal "
        f"≥ 20,000): the worker started and warmed, then {throughput['rows']:,} rows produced "
        "live, round-robin over the partitions so that every window closes by its row count; "
        "timed from the first row produced to the broker timestamp of the last relQuery. "
        "This process's producer alone ran at "
        f"{throughput['producer_rows_per_second']:,.0f} rows/s, so the figure is a floor "
        "where the two are close.",
        "",
        "Idle embedded brokers, one consumer waiting on an empty topic for 10 s (share of "
        "one core): "
        + ", ".join(f"{kind} {cpu:.0%}" for kind, cpu in document["broker_idle_cpu"].items())
        + f". The default broker is {DEFAULT_BROKER}.",
        "",
        f"The same {document['relqueries']} relQueries at each load (a fraction of the "
        f"measured capacity, {document['capacity_relqueries_per_s']:.4f} relQueries/s, "
        "Poisson), one warmed engine, prefix cache reset before each run: straight to the "
        "engine, then through Kafka and straight again, in turn; each Kafka run is set "
        "against the direct runs beside it (`relstream_lab/streaming/overhead.py`). Through Kafka, "
        "latency "
        "runs from producing the relquery message to consuming its result; the backlog is "
        "the relQueries produced and not yet answered; RSS is the benchmark process (the "
        "engine's front end and service) plus vLLM's engine core.",
        "",
        "![overhead](overhead.png)",
        "",
    ]
