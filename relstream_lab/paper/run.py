"""`relstream-lab bench paper`: the paper's experiment on the simulated engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from relstream.scheduler import DEFAULT_POLICY
from relstream.sim.profiles import get_profile
from relstream_lab.common.report import (
    machine_description,
    markdown_by_query_type,
    markdown_rates,
    markdown_summary,
    plot_breakdown,
    plot_latency_vs_rate,
    ratios_at,
    write_report,
)
from relstream_lab.common.runner import RunSummary, run_grid
from relstream_lab.common.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream_lab.paper.decision import DecisionBenchmark, run_decision_benchmark

REFERENCE = DEFAULT_POLICY  # every other policy's mean is quoted relative to it


@dataclass(frozen=True)
class SimBenchOptions:
    profile: str
    policies: tuple[str, ...]
    rates: tuple[float, ...]
    trace: TraceConfig
    datasets_dir: Path | None
    out_dir: Path
    cost_model: str = "online"
    decision_benchmark: bool = True
    command: str = ""


def run_sim_benchmark(
    options: SimBenchOptions,
    on_trace: Callable[[int, int], None] | None = None,
    on_run: Callable[[RunSummary], None] | None = None,
) -> dict:
    profile = get_profile(options.profile)
    datasets = load_datasets(options.datasets_dir)
    trace = tokenize_trace(generate_relqueries(options.trace, datasets), options.trace)
    requests = sum(len(ids) for ids in trace.token_ids.values())
    if on_trace:
        on_trace(len(trace.entries), requests)
    summaries = run_grid(
        trace, profile, options.policies, options.rates, options.cost_model, on_run
    )
    decision = run_decision_benchmark() if options.decision_benchmark else None
    top_rate = max(options.rates)
    prompt_lengths = [len(ids) for rows in trace.token_ids.values() for ids in rows]
    output_lengths = [n for rows in trace.output_lengths.values() for n in rows]
    document = {
        "command": options.command,
        "machine": machine_description(),
        "profile": options.profile,
        "limits": asdict(profile.limits),
        "cost_model": options.cost_model,
        "trace": {
            **asdict(options.trace),
            "datasets": sorted({e.dataset for e in trace.entries}),
            "relqueries": len(trace.entries),
            "requests": requests,
            "mean_prompt_tokens": sum(prompt_lengths) / len(prompt_lengths),
            "mean_output_tokens": sum(output_lengths) / len(output_lengths),
        },
        "runs": [s.as_dict() for s in summaries],
        "top_rate": top_rate,
        "reference_policy": REFERENCE,
        "ratios_at_top_rate": ratios_at(summaries, top_rate, REFERENCE),
        "decision_benchmark": decision.as_dict() if decision else None,
    }
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    title = f"simulated {options.profile}"
    plot_latency_vs_rate(summaries, out / "latency_vs_rate.png", title)
    plot_breakdown(summaries, top_rate, out / "breakdown.png", title)
    write_report(
        out,
        f"Simulated benchmark: {document['profile']}",
        document,
        _setting(document),
        _body(document, summaries, decision),
    )
    return document


def _setting(document: dict) -> str:
    trace = document["trace"]
    return (
        f"Cost model in the scheduler: "
        f"{document['cost_model']}. Trace: {trace['relqueries']} relQueries, "
        f"{trace['requests']} requests over {', '.join(trace['datasets'])}; mean prompt "
        f"{trace['mean_prompt_tokens']:.0f} tokens (SmolLM2 tokenizer, chat template "
        f"included), mean output {trace['mean_output_tokens']:.1f} tokens; "
        f"{trace['arrival']} arrivals, seed {trace['seed']}."
    )


def _body(
    document: dict, summaries: Sequence[RunSummary], decision: DecisionBenchmark | None
) -> list[str]:
    top = document["top_rate"]
    lines = [
        f"## At the highest rate ({top:g} relQueries/s)",
        "",
        *markdown_summary(summaries, top),
        "",
        f"Mean latency relative to {document['reference_policy']} (same run): "
        + ", ".join(
            f"{policy} {ratio:.2f}x" for policy, ratio in document["ratios_at_top_rate"].items()
        )
        + ".",
        "",
        f"Mean latency (s) by query type at {top:g} relQueries/s, and KV preemptions:",
        "",
        *markdown_by_query_type(summaries, top),
        "",
        "## Mean relQuery latency (s) per arrival rate",
        "",
        *markdown_rates(summaries),
        "",
        "![latency vs rate](latency_vs_rate.png) ![breakdown](breakdown.png)",
        "",
    ]
    if decision:
        lines += [
            "## Scheduler decision time on a crowded engine",
            "",
            f"One {decision.policy} decision with {decision.waiting_relqueries} waiting "
            f"relQueries ({decision.waiting_requests} waiting requests) and "
            f"{decision.running_requests} running requests: median "
            f"{decision.median_us:.0f} µs, p99 {decision.p99_us:.0f} µs over "
            f"{decision.timed_decisions} decisions. The very first decision, which "
            f"ranks every newcomer once, took {decision.first_decision_ms:.1f} ms.",
            "",
        ]
    return lines
