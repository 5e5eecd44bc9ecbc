"""Writing the real-engine benchmark: results.json, plots, README.md, the fitted cost
model next to the simulator's profiles, and the simulator's prediction of each run."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from relstream.bench.report import (
    machine_description,
    markdown_by_query_type,
    markdown_rates,
    markdown_summary,
    plot_breakdown,
    plot_latency_vs_rate,
    ratios_at,
    write_report,
)
from relstream.bench.runner import RunSummary, run_grid
from relstream.bench.stepfit import fit_step_costs, profile_document
from relstream.bench.vllmbench import (
    VllmBenchOptions,
    fit_cost_model,
    mean_overhead_fraction,
    read_step_log,
)
from relstream.bench.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream.sim.profiles import CostProfile, profile_from_document

FITTED_PROFILE_FILE = "fitted_profile.json"


def simulate_same_runs(
    measured: dict, trace_config: TraceConfig, profile: CostProfile
) -> dict[str, dict[str, float]]:
    """The simulator replaying each run on `profile`: the same relQueries and arrival
    rate, each row ending where it ended on the real engine."""
    trace = tokenize_trace(measured["entries"], trace_config, measured["output_tokens"])
    predictions: dict[str, dict[str, float]] = {}
    for summary in measured["summaries"]:
        rate = measured["rates"][f"{summary.rate:g}"]
        (predicted,) = run_grid(trace, profile, [summary.policy], [rate], "online")
        predictions[f"{summary.policy}@{summary.rate:g}"] = {
            "real_mean": summary.mean,
            "predicted_mean": predicted.mean,
            "error": predicted.mean / summary.mean - 1.0,
        }
    return predictions


def write_vllm_report(measured: dict, options: VllmBenchOptions) -> dict:
    out = options.out_dir
    summaries: list[RunSummary] = measured["summaries"]
    step_fit = fit_step_costs(measured["steps"])
    fitted = profile_document(step_fit, measured["limits"], "cpu-smollm2", str(out))
    predictions = simulate_same_runs(measured, options.trace, profile_from_document(fitted))
    top = max(options.load_fractions)
    document = {
        "command": options.command,
        "machine": machine_description(),
        "model": options.model,
        "trace": {
            **{k: v for k, v in vars(options.trace).items()},
            "relqueries": len(measured["entries"]),
        },
        "capacity_relqueries_per_s": measured["capacity_relqueries_per_s"],
        "rates_relqueries_per_s": measured["rates"],
        "runs": [s.as_dict() for s in summaries],
        "ratios_vs_relserve_at_top_load": ratios_at(summaries, top, "relserve"),
        "scheduling_overhead": measured["overhead"],
        "fitted_cost_model": measured["fitted_cost_model"],
        "step_cost_fit": step_fit,
        "limits": measured["limits"],
        "simulator_prediction": predictions,
        "output_tokens": measured["output_tokens"],
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / FITTED_PROFILE_FILE).write_text(json.dumps(fitted, indent=2) + "\n")
    title = f"vLLM CPU, {options.model}"
    plot_latency_vs_rate(
        summaries, out / "latency_vs_rate.png", title, "load (fraction of capacity)"
    )
    plot_breakdown(summaries, top, out / "breakdown.png", title, "of capacity")
    write_report(
        out,
        f"Real-engine benchmark: vLLM CPU build, {document['model']}",
        document,
        f"Capacity measured first (whole trace submitted at once, stock vLLM): "
        f"{document['capacity_relqueries_per_s']:.4f} relQueries/s; loads are fractions of "
        "it. Greedy decoding; each policy in its own engine.",
        _body(document, summaries, top),
    )
    return document


def _batch(stats: dict) -> str:
    batch = stats.get("mean_decode_batch")
    return "–" if batch is None else f"{batch:.1f}"


def _body(document: dict, summaries: list[RunSummary], top: float) -> list[str]:
    policies = list(dict.fromkeys(s.policy for s in summaries))
    overhead_line = ", ".join(
        f"{p} {mean_overhead_fraction(document['scheduling_overhead'], p):.2%}" for p in policies
    )
    prediction_rows = [
        f"| {key} | {p['real_mean']:.2f} | {p['predicted_mean']:.2f} | {p['error']:+.0%} |"
        for key, p in document["simulator_prediction"].items()
    ]
    cost = document["fitted_cost_model"]
    fit = document["step_cost_fit"]
    return [
        f"## At the highest load ({top:g} of capacity)",
        "",
        *markdown_summary(summaries, top),
        "",
        "Mean latency relative to relserve (same run): "
        + ", ".join(f"{p} {r:.2f}x" for p, r in document["ratios_vs_relserve_at_top_load"].items())
        + ".",
        "",
        "Scheduling overhead (policy decision + adapter) as a share of busy step time: "
        f"{overhead_line}.",
        "",
        *markdown_by_query_type(summaries, top),
        "",
        "Step composition from the step logs (busy = summed step time):",
        "",
        "| policy@load | prefill | decode | mixed | mean decode batch | busy (s) | overhead |",
        "|---|---|---|---|---|---|---|",
        *[
            f"| {key} | {v['steps'].get('prefill', 0)} | {v['steps'].get('decode', 0)} | "
            f"{v['steps'].get('mixed', 0)} | {_batch(v)} | "
            f"{v['busy_s']:.1f} | "
            f"{v['overhead_fraction']:.2%} |"
            for key, v in document["scheduling_overhead"].items()
        ],
        "",
        "## Mean relQuery latency (s) per load",
        "",
        *markdown_rates(summaries),
        "",
        "![latency vs load](latency_vs_rate.png) ![breakdown](breakdown.png)",
        "",
        "## Fitted cost model and the simulator's prediction",
        "",
        f"From the step logs (`steps-*.jsonl`): L_prefill = {cost['alpha_p'] * 1e3:.3f} ms × "
        f"uncached tokens + {cost['beta_p'] * 1e3:.1f} ms ({cost['prefill_steps']} prefill "
        f"steps); L_decode = {cost['alpha_d'] * 1e3:.3f} ms × requests + "
        f"{cost['beta_d'] * 1e3:.1f} ms ({cost['decode_steps']} decode steps): the paper's "
        "form, pure steps only.",
        "",
        f"All {fit['steps']} steps at once, mixed ones included (`relstream.bench.stepfit`): "
        f"{fit['base'] * 1e3:.1f} ms + {fit['per_uncached_token'] * 1e3:.3f} ms × uncached "
        f"tokens + {fit['per_decode_request'] * 1e3:.3f} ms × decodes + "
        f"{fit['per_context_token'] * 1e6:.3f} µs × decode context tokens; predicted / real "
        "busy time "
        + ", ".join(
            f"{kind} {v['busy_ratio']:.2f} (mean error {v['mean_abs_error']:.0%}, {v['steps']})"
            for kind, v in fit["by_kind"].items()
        )
        + f". The simulator replays each run on it, rows ending where they really ended. "
        f"Committed as `{FITTED_PROFILE_FILE}`, a simulator profile: copy it to "
        "`relstream/sim/data/cpu-smollm2.json` to adopt it.",
        "",
        "| policy@load | real mean (s) | simulated mean (s) | error |",
        "|---|---|---|---|",
        *prediction_rows,
        "",
    ]


def rebuild_vllm_report(out: Path, datasets_dir: Path | None) -> dict:
    """The report of a finished run rebuilt from its results.json and step logs (after a
    change to the fit or the simulator), without running the engine again."""
    document = json.loads((out / "results.json").read_text())
    trace_fields = {f.name for f in fields(TraceConfig)}
    trace = TraceConfig(**{k: v for k, v in document["trace"].items() if k in trace_fields})
    runs = [RunSummary(**run) for run in document["runs"]]
    steps = [
        step
        for path in sorted(out.glob("steps-*.jsonl"))
        if path.name != "steps-capacity.jsonl"
        for step in read_step_log(path)[1]
    ]
    options = VllmBenchOptions(
        model=document["model"],
        policies=tuple(dict.fromkeys(run.policy for run in runs)),
        load_fractions=tuple(float(key) for key in document["rates_relqueries_per_s"]),
        trace=trace,
        datasets_dir=datasets_dir,
        out_dir=out,
        command=document["command"],
    )
    measured = {
        "capacity_relqueries_per_s": document["capacity_relqueries_per_s"],
        "rates": document["rates_relqueries_per_s"],
        "summaries": runs,
        "overhead": document["scheduling_overhead"],
        "fitted_cost_model": fit_cost_model(steps),
        "limits": document["limits"],
        "entries": generate_relqueries(trace, load_datasets(datasets_dir)),
        "steps": steps,
        "output_tokens": document["output_tokens"],
    }
    return write_vllm_report(measured, options)
