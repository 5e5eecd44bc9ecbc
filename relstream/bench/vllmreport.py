"""Writing the real-engine benchmark: results.json, plots, README.md, the fitted cost
model next to the simulator's profiles, and the simulator's prediction of each run."""

from __future__ import annotations

import json
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
from relstream.bench.vllmbench import VllmBenchOptions, fitted_profile, mean_overhead_fraction
from relstream.bench.workload import tokenize_trace
from relstream.scheduler import EngineLimits

FITTED_PROFILE_FILE = "fitted_profile.json"


def write_fitted_profile(path: Path, measured: dict, source: str) -> None:
    """The fitted cost model as a simulator profile document (`relstream.sim.profiles`)."""
    cost = measured["fitted_cost_model"]
    document = {
        "name": "cpu-smollm2",
        "kind": "linear",
        "description": "fitted by `relstream bench --backend vllm` from its step logs (pure "
        "prefill and pure decode steps).",
        "source": source,
        "limits": measured["limits"],
        "prefill_per_token": cost["alpha_p"],
        "prefill_base": cost["beta_p"],
        "decode_per_request": cost["alpha_d"],
        "decode_base": cost["beta_d"],
        "fitted_from": {key: cost[key] for key in ("prefill_steps", "decode_steps")},
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def simulate_same_runs(measured: dict, options: VllmBenchOptions) -> dict[str, dict[str, float]]:
    """The simulator on the fitted profile, same trace and rates: predicted vs real mean."""
    profile = fitted_profile(
        "cpu-smollm2", measured["fitted_cost_model"], EngineLimits(**measured["limits"])
    )
    trace = tokenize_trace(measured["entries"], options.trace)
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
    predictions = simulate_same_runs(measured, options)
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
        "limits": measured["limits"],
        "simulator_prediction": predictions,
        "output_tokens": measured["output_tokens"],
    }
    out.mkdir(parents=True, exist_ok=True)
    write_fitted_profile(out / FITTED_PROFILE_FILE, measured, str(out))
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
        f"{cost['beta_d'] * 1e3:.1f} ms ({cost['decode_steps']} decode steps). Committed as "
        f"`{FITTED_PROFILE_FILE}` beside these results, in the format of the simulator's "
        "profiles: copy it to `relstream/sim/data/cpu-smollm2.json` to adopt it.",
        "",
        "| policy@load | real mean (s) | simulated mean (s) | error |",
        "|---|---|---|---|",
        *prediction_rows,
        "",
    ]
