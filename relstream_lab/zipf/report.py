"""The report of `relstream-lab bench zipf`: results.json, a README table per profile and a
plot of mean latency by variant."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path

from relstream_lab.common.report import machine_description, write_readme
from relstream_lab.zipf.sim import VARIANTS

BASELINE = "v1-priority"  # the target: mean latency at least 2x lower than stock V1 priority's
TARGET = 2.0


def _spread(values: Sequence[float], fmt: str) -> str:
    mean = statistics.fmean(values)
    return f"{mean:{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def by_profile(records: Sequence[dict]) -> dict[str, dict[str, list[dict]]]:
    """Records by profile, then variant, seeds in order."""
    grouped: dict[str, dict[str, list[dict]]] = {}
    for record in sorted(records, key=lambda r: r["seed"]):
        grouped.setdefault(record["profile"], {}).setdefault(record["variant"], []).append(record)
    return grouped


def profile_table(runs: dict[str, list[dict]]) -> list[str]:
    baseline = {r["seed"]: r for r in runs[BASELINE]}
    fcfs = {r["seed"]: r for r in runs["v1-fcfs"]}
    lines = [
        f"| variant | mean (s) | {BASELINE} / mean | p99 (s) | makespan (s) | requests run "
        "| prompt tokens computed / v1-fcfs | prefix hit rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for variant, seeds in runs.items():
        ratio = [baseline[r["seed"]]["mean"] / r["mean"] for r in seeds]
        computed = [
            r["prompt_tokens_computed"] / fcfs[r["seed"]]["prompt_tokens_computed"] for r in seeds
        ]
        hit = [1 - r["prompt_tokens_computed"] / r["prompt_tokens"] for r in seeds]
        lines.append(
            f"| {variant} | {_spread([r['mean'] for r in seeds], '.2f')} "
            f"| {_spread(ratio, '.2f')}x | {_spread([r['p99'] for r in seeds], '.1f')} "
            f"| {_spread([r['makespan'] for r in seeds], '.1f')} "
            f"| {statistics.fmean(r['requests_run'] for r in seeds):.0f} of "
            f"{statistics.fmean(r['rows'] for r in seeds):.0f} "
            f"| {_spread(computed, '.2f')}x | {_spread(hit, '.1%')} |"
        )
    return lines


def target_line(records: Sequence[dict]) -> tuple[int, int, float]:
    """Runs of full relstream at least TARGET x below v1-priority, of all, and the worst."""
    full = list(VARIANTS)[-1]
    baseline = {(r["profile"], r["seed"]): r["mean"] for r in records if r["variant"] == BASELINE}
    ratios = [
        baseline[(r["profile"], r["seed"])] / r["mean"] for r in records if r["variant"] == full
    ]
    return sum(ratio >= TARGET for ratio in ratios), len(ratios), min(ratios)


def plot(records: Sequence[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = by_profile(records)
    figure, axes = plt.subplots(1, len(grouped), figsize=(5 * len(grouped), 4), squeeze=False)
    for axis, (profile, runs) in zip(axes[0], grouped.items(), strict=True):
        names = list(runs)
        means = [statistics.fmean(r["mean"] for r in runs[name]) for name in names]
        axis.barh(range(len(names)), means, color="tab:blue")
        axis.set_yticks(range(len(names)), [n.replace(" + ", "\n+ ") for n in names], fontsize=7)
        axis.invert_yaxis()
        axis.set_xscale("log")
        axis.set_xlabel("mean relQuery latency (s, log)")
        axis.set_title(profile, fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(records: list[dict], out: Path, command: str, options_text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(records, indent=1) + "\n")
    plot(records, out / "mean_by_variant.png")
    held, runs, worst = target_line(records)
    lines = [
        "# A stream that repeats itself: Zipf catalogue enrichment (simulator)",
        "",
        "Reproduce with:",
        "",
        f"```\n{command}\n```",
        "",
        f"Machine: {machine_description()}. {options_text}",
        "",
        f"**Target** (mean at least {TARGET:g}x below `{BASELINE}`, every mechanism on): "
        f"{held} of {runs} runs; worst {worst:.2f}x.",
    ]
    for profile, runs_by_variant in by_profile(records).items():
        block = runs_by_variant[BASELINE][0]["block"]
        lines += ["", f"## {profile} (KV blocks of {block} tokens)", ""]
        lines += profile_table(runs_by_variant)
    lines += ["", "![mean latency by variant](mean_by_variant.png)", ""]
    write_readme(out, lines)
