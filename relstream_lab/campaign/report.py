"""The real-engine campaign's report, built from its checkpoint (`runs.jsonl`, step
logs, output lengths): results.json, plots, README.md, the fitted step-cost profile, and
the simulator's replay of every run."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from relstream.scheduler import CostModel
from relstream.scheduler.steprecord import StepRecord
from relstream.sim.profiles import profile_from_document
from relstream.sim.sharing import Sharing
from relstream_lab.campaign.checkpoint import (
    Checkpoint,
    Epoch,
    read_step_log,
    reported_runs,
    run_epoch,
    step_log_of,
    trace_name,
)
from relstream_lab.campaign.run import (
    VllmBenchOptions,
    fit_cost_model,
    mean_overhead_fraction,
    run_windows,
)
from relstream_lab.campaign.stepfit import fit_step_costs, profile_document
from relstream_lab.campaign.targets import (
    BASELINES,
    fidelity,
    judge_targets,
    ratios,
    target_table,
)
from relstream_lab.common.report import machine_description, write_report
from relstream_lab.common.runner import RunSummary, run_grid
from relstream_lab.common.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)

# What the campaign's engine shares, as campaign.json's "engine_shares" names it:
# `VllmRuntime` runs identical requests in flight once under every policy
# (`engine/twins.py`) and keeps no answer cache; engines before 92a4eff (2026-11-25)
# shared nothing, and campaigns of theirs carry no such field.
ENGINE_SHARES = "in-flight"
SHARING = {"none": Sharing(), "in-flight": Sharing(dedup=True)}


def engine_shares(campaign: dict) -> str:
    """What the engine of the campaign described by `campaign` (campaign.json) shared,
    by its name in `SHARING`."""
    return campaign.get("engine_shares", "none")


def engine_sharing(campaign: dict) -> Sharing:
    """The same as the simulator's `Sharing`."""
    return SHARING[engine_shares(campaign)]


def save_campaign(options: VllmBenchOptions) -> None:
    """What the campaign runs, for the report and for a resumed run."""
    document = {
        "command": options.command,
        "model": options.model,
        "policies": options.policies,
        "loads": options.load_fractions,
        "seeds": options.seeds,
        "seeded_loads": options.seeded_loads,
        "arrivals": options.arrivals,
        "burstiness": options.burstiness,
        "trace": asdict(options.trace),
        "engine_shares": ENGINE_SHARES,
    }
    (options.out_dir / "campaign.json").write_text(json.dumps(document, indent=2) + "\n")


def write_vllm_report(out: Path, datasets_dir: Path | None) -> dict:
    campaign = json.loads((out / "campaign.json").read_text())
    checkpoint = Checkpoint(out, resume=True)
    epochs = checkpoint.epochs()
    every_run = checkpoint.runs()
    runs = reported_runs(every_run, campaign["policies"])
    fits = {}
    for epoch in epochs:
        steps, limits = _epoch_steps(out, runs, epoch)
        fits[epoch.number] = fit_step_costs(steps)
        fitted = profile_document(fits[epoch.number], limits, "cpu-smollm2", str(out))
        (out / epoch.profile_file).write_text(json.dumps(fitted, indent=2) + "\n")
    _predict(runs, every_run, out, campaign, epochs, datasets_dir)
    steps, limits = _epoch_steps(out, runs, epochs[0])
    document = {
        "command": campaign["command"],
        "machine": "; ".join(f"epoch {e.number}: {e.machine}" for e in epochs),
        "report_built_on": machine_description(),
        "model": campaign["model"],
        "campaign": campaign,
        "capacity_relqueries_per_s": epochs[0].capacity,
        "epochs": [
            {
                "epoch": e.number,
                "machine": e.machine,
                "capacity_relqueries_per_s": e.capacity,
                "step_cost_fit": fit,
            }
            for e, fit in zip(epochs, fits.values(), strict=True)
        ],
        "runs": runs,
        "runs_not_reported": [run for run in every_run if run not in runs],
        "ratios": ratios(runs),
        "targets": judge_targets(ratios(runs)),
        "fidelity": fidelity(runs),
        "fidelity_one_profile": fidelity(runs, "_one_profile"),
        "scheduling_overhead": {
            policy: mean_overhead_fraction(runs, policy) for policy in campaign["policies"]
        },
        "step_cost_fit": fits[0],
        "fitted_cost_model": fit_cost_model(steps),
        "limits": limits,
    }
    _plot(runs, out, campaign)
    capacities = ", ".join(f"epoch {e.number}: {e.capacity:.4f}" for e in epochs)
    setting = (
        "Capacity, measured with the whole first trace submitted at once to stock vLLM V1 "
        "(`v1-fcfs`) on each machine speed the campaign ran on (an epoch), in "
        f"relQueries/s: {capacities}. Every load is a fraction of its epoch's capacity, "
        "and policies are compared only inside one epoch. Greedy decoding; each policy in "
        "its own engine per trace and load (per trace in epoch 0)."
    )
    write_report(
        out,
        f"Real-engine benchmark: vLLM CPU build, {campaign['model']}",
        document,
        setting,
        _body(document),
    )
    return document


def _epoch_steps(out: Path, runs: list[dict], epoch: Epoch) -> tuple[list[StepRecord], dict]:
    """Every step logged on one epoch's machine: its capacity run and its engines."""
    logs = {out / step_log_of(run) for run in runs if run_epoch(run) == epoch.number}
    steps: list[StepRecord] = []
    limits: dict = {}
    for path in sorted({epoch.capacity_log, *logs}):
        header, logged = read_step_log(path)
        limits = header.limits if header and header.limits else limits
        steps += logged
    return steps, limits


def _predict(
    runs: list[dict],
    every_run: list[dict],
    out: Path,
    campaign: dict,
    epochs: list[Epoch],
    datasets_dir: Path | None,
) -> None:
    """The simulator replays every run: same relQueries and arrival rate, each row ending
    where it ended on the real engine, identical requests shared as the campaign's engine
    shared them (`SHARING`), the policy's cost lines fitted online or fixed as
    they were in the run, steps timed by a line fitted to that run's own steps
    (`predicted_mean`). The machine's speed drifts between runs by more than the target
    (the same step shapes ran up to 8 % slower in one engine than in another), so a
    profile shared by every run of its epoch is reported beside it
    (`predicted_mean_one_profile`)."""
    shared = {
        e.number: profile_from_document(json.loads((out / e.profile_file).read_text()))
        for e in epochs
    }
    datasets = load_datasets(datasets_dir)
    sharing = engine_sharing(campaign)
    traces: dict[str, object] = {}
    engines = _by_engine(every_run)
    for log, records in _by_engine(runs).items():
        header, steps = read_step_log(out / log)
        arrival, seed = records[0]["arrival"], records[0]["seed"]
        config = TraceConfig(
            **{
                **campaign["trace"],
                "arrival": arrival,
                "seed": seed,
                "burstiness": campaign["burstiness"] if arrival == "gamma" else 1.0,
            }
        )
        name = trace_name(config)
        if name not in traces:
            outputs = json.loads((out / f"outputs-{name}.json").read_text())
            traces[name] = tokenize_trace(generate_relqueries(config, datasets), config, outputs)
        # An older record's window is found by walking back over every run its engine
        # served, the runs no longer reported included.
        served = engines[log]
        windows = dict(zip(map(id, served), run_windows(served, steps), strict=True))
        for run in records:
            start, end = windows[id(run)]
            own = [s for s in steps if start <= s.t <= end]
            epoch_profile = shared[run_epoch(run)]
            profile = _run_profile(own, header.limits) or epoch_profile
            capacity = epochs[run_epoch(run)].capacity
            for suffix, used in (("", profile), ("_one_profile", epoch_profile)):
                predicted = _replay(traces[name], used, run, capacity, sharing)
                run[f"predicted_mean{suffix}"] = predicted.mean
                run[f"predicted_makespan{suffix}"] = predicted.makespan
                run[f"prediction_error{suffix}"] = predicted.mean / run["mean"] - 1.0
                run[f"makespan_prediction_error{suffix}"] = (
                    predicted.makespan / run["makespan"] - 1.0
                )


def _by_engine(runs: list[dict]) -> dict[str, list[dict]]:
    """The runs each engine served, by its step log, in load order."""
    engines: dict[str, list[dict]] = {}
    for run in runs:
        engines.setdefault(step_log_of(run), []).append(run)
    return engines


def _run_profile(steps: list[StepRecord], limits: dict):
    """A profile fitted to one run's steps, or None when it has too few to fit."""
    try:
        fit = fit_step_costs(steps)
    except ValueError:
        return None
    return profile_from_document(profile_document(fit, limits, "run", "one run's steps"))


def _replay(trace, profile, run: dict, capacity: float, sharing: Sharing) -> RunSummary:
    kind, prior = "online", None
    if run.get("cost_model") == "fixed":  # the run's own coefficients, kept
        kind, prior = "fixed", CostModel.from_coefficients(run["cost_coefficients"])
    rate = run["rate"] * capacity
    (predicted,) = run_grid(trace, profile, [run["policy"]], [rate], kind, None, prior, sharing)
    return predicted


def _spread(runs: list[dict], arrival: str, load: float, policy: str) -> str:
    means = [
        r["mean"] for r in runs if (r["arrival"], r["rate"], r["policy"]) == (arrival, load, policy)
    ]
    if not means:
        return "–"
    if len(means) == 1:
        return f"{means[0]:.1f}"
    return f"{statistics.fmean(means):.1f} ({min(means):.1f}–{max(means):.1f})"


def _body(document: dict) -> list[str]:
    runs, campaign = document["runs"], document["campaign"]
    policies = campaign["policies"]
    lines = []
    for arrival in campaign["arrivals"]:
        loads = sorted({r["rate"] for r in runs if r["arrival"] == arrival})
        lines += [
            f"## Mean relQuery latency (s), {arrival} arrivals: mean over seeds (min–max)",
            "",
            "| load | " + " | ".join(policies) + " |",
            "|---" * (len(policies) + 1) + "|",
            *[
                f"| {load:g} | "
                + " | ".join(_spread(runs, arrival, load, p) for p in policies)
                + " |"
                for load in loads
            ],
            "",
        ]
    lines += [
        "## relstream against each baseline, per trace (baseline mean / relstream mean)",
        "",
        "| arrival | seed | load | " + " | ".join(BASELINES) + " | max vs v1-fcfs |",
        "|---" * (len(BASELINES) + 4) + "|",
        *[
            f"| {r['arrival']} | {r['seed']} | {r['rate']:g} | "
            + " | ".join(f"{r[b]:.2f}x" if b in r else "–" for b in BASELINES)
            + f" | {r.get('max_vs_v1_fcfs', float('nan')):.2f}x |"
            for r in document["ratios"]
        ],
        "",
        "## Targets, each on its worst trace so far",
        "",
        *target_table(document["targets"]),
        "",
        "## Every run: p50, p99, max, and the simulator's replay",
        "",
        "Simulated: the run replayed with its own steps' cost line; one profile: with the "
        "line fitted over every run's steps in its epoch. Identical requests are shared as "
        f"the engine shared them ({engine_shares(campaign)}). Each simulated "
        "value with its error against the real run.",
        "",
        "| policy | arrival | seed | load | epoch | mean | p50 | p99 | max | makespan "
        "| simulated mean | makespan | one profile: mean | makespan |",
        "|---" * 14 + "|",
        *[
            f"| {r['policy']} | {r['arrival']} | {r['seed']} | {r['rate']:g} | "
            f"{run_epoch(r)} | "
            f"{r['mean']:.2f} | {r['p50']:.2f} | {r['p99']:.2f} | {r['max']:.2f} | "
            f"{r['makespan']:.1f} | "
            f"{_predicted(r, 'predicted_mean', 'prediction_error')} | "
            f"{_predicted(r, 'predicted_makespan', 'makespan_prediction_error')} | "
            f"{_predicted(r, 'predicted_mean', 'prediction_error', '_one_profile')} | "
            f"{_predicted(r, 'predicted_makespan', 'makespan_prediction_error', '_one_profile')} |"
            for r in runs
        ],
        "",
    ]
    fid, shared, fit = (
        document["fidelity"],
        document["fidelity_one_profile"],
        document["step_cost_fit"],
    )
    lines += [
        f"Simulator fidelity: {_fidelity(fid)} replayed with their own steps' line; "
        f"{_fidelity(shared)} with one profile per epoch. Step costs, "
        f"fitted over epoch 0's {fit['steps']} logged steps (mixed ones included): "
        f"{fit['base'] * 1e3:.1f} ms + {fit['per_uncached_token'] * 1e3:.3f} ms × uncached "
        f"tokens + {fit['per_decode_request'] * 1e3:.3f} ms × decodes + "
        f"{fit['per_context_token'] * 1e6:.3f} µs × decode context tokens "
        f"(`fitted_profile.json`, a simulator profile).",
        "",
        "Scheduling overhead (policy decision + adapter) as a share of busy step time: "
        + ", ".join(f"{p} {v:.2%}" for p, v in document["scheduling_overhead"].items())
        + ".",
        "",
        *[f"![{a}](latency_vs_load-{a}.png)" for a in campaign["arrivals"]],
        "",
    ]
    return lines


def _predicted(run: dict, value: str, error: str, suffix: str = "") -> str:
    if f"{value}{suffix}" not in run:
        return "–"
    return f"{run[value + suffix]:.1f} ({run[error + suffix]:+.0%})"


def _fidelity(fid: dict) -> str:
    """One `targets.fidelity` summary in words."""
    return (
        f"{fid['within_target']} of {fid['runs']} runs within {fid['target']:.0%} on both "
        f"mean and makespan (largest errors {fid['max_abs_error']:.0%} and "
        f"{fid.get('max_abs_makespan_error', float('nan')):.0%}), relstream on the real "
        f"runs' side of stock V1 in {fid.get('right_sign', 0)} of "
        f"{fid.get('comparisons', 0)} comparisons"
    )


def _plot(runs: list[dict], out: Path, campaign: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for arrival in campaign["arrivals"]:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for policy in campaign["policies"]:
            mine = [r for r in runs if r["policy"] == policy and r["arrival"] == arrival]
            loads = sorted({r["rate"] for r in mine})
            means = [[r["mean"] for r in mine if r["rate"] == load] for load in loads]
            centre = [statistics.fmean(m) for m in means]
            low = [c - min(m) for c, m in zip(centre, means, strict=True)]
            high = [max(m) - c for c, m in zip(centre, means, strict=True)]
            ax.errorbar(loads, centre, yerr=[low, high], marker="o", capsize=3, label=policy)
        ax.set_xlabel("load (fraction of measured capacity)")
        ax.set_ylabel("mean relQuery latency (s)")
        ax.set_title(f"vLLM CPU, {campaign['model']}, {arrival} arrivals")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"latency_vs_load-{arrival}.png", dpi=120)
        plt.close(fig)
