"""Benchmark outputs: results.json, latency_vs_rate.png, breakdown.png, README.md."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from relstream_lab.common.runner import RunSummary, run_pooled


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {os.cpu_count()} cores, {system}, Python {platform.python_version()}"


def ratios_at(summaries: Sequence[RunSummary], rate: float, target: str) -> dict[str, float]:
    """Mean latency of each policy divided by the target's, at one rate."""
    means = {s.policy: s.mean for s in summaries if s.rate == rate}
    if target not in means:
        return {}
    return {policy: mean / means[target] for policy, mean in means.items() if policy != target}


def plot_latency_vs_rate(
    summaries: Sequence[RunSummary],
    path: Path,
    title: str,
    xlabel: str = "relQuery arrival rate (relQueries/s)",
) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for policy in dict.fromkeys(s.policy for s in summaries):
        points = sorted((s.rate, s.mean) for s in summaries if s.policy == policy)
        ax.plot([r for r, _ in points], [m for _, m in points], marker="o", label=policy)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("mean relQuery latency (s)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_breakdown(
    summaries: Sequence[RunSummary],
    rate: float,
    path: Path,
    title: str,
    unit: str = "relQueries/s",
) -> None:
    at_rate = [s for s in summaries if s.rate == rate]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = [s.policy for s in at_rate]
    bottom = [0.0] * len(at_rate)
    for part in ("waiting", "core", "tail"):
        values = [getattr(s, part) for s in at_rate]
        ax.bar(names, values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("mean relQuery latency (s)")
    ax.tick_params(axis="x", labelrotation=25)
    ax.set_title(f"{title}: breakdown at {rate:g} {unit}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def markdown_summary(summaries: Sequence[RunSummary], rate: float) -> list[str]:
    lines = [
        "| policy | mean (s) | p50 | p99 | max | waiting | core | tail "
        "| decision median (µs) | decision p99 (µs) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in (s for s in summaries if s.rate == rate):
        lines.append(
            f"| {s.policy} | {s.mean:.2f} | {s.p50:.2f} | {s.p99:.2f} | {s.max:.2f} | "
            f"{s.waiting:.2f} | {s.core:.2f} | {s.tail:.2f} | {s.decision_us_median:.0f} | "
            f"{s.decision_us_p99:.0f} |"
        )
    return lines


def markdown_rates(summaries: Sequence[RunSummary]) -> list[str]:
    rates = sorted({s.rate for s in summaries})
    policies = list(dict.fromkeys(s.policy for s in summaries))
    means = {(s.policy, s.rate): s.mean for s in summaries}
    lines = ["| policy | " + " | ".join(f"{r:g}/s" for r in rates) + " |"]
    lines.append("|---" * (len(rates) + 1) + "|")
    for policy in policies:
        cells = " | ".join(f"{means[(policy, r)]:.2f}" for r in rates)
        lines.append(f"| {policy} | {cells} |")
    return lines


def write_results(out_dir: Path, document: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "results.json").write_text(json.dumps(document, indent=2) + "\n")


def markdown_by_query_type(summaries: Sequence[RunSummary], rate: float) -> list[str]:
    at_rate = [s for s in summaries if s.rate == rate]
    types = sorted({t for s in at_rate for t in s.mean_by_query_type})
    lines = [
        "| policy | " + " | ".join(types) + " | preemptions |",
        "|---" * (len(types) + 2) + "|",
    ]
    for s in at_rate:
        cells = " | ".join(f"{s.mean_by_query_type.get(t, float('nan')):.2f}" for t in types)
        lines.append(f"| {s.policy} | {cells} | {s.preemptions} |")
    return lines


def write_report(out: Path, title: str, document: dict, setting: str, body: list[str]) -> None:
    """A benchmark's results.json and README.md, alike for every benchmark: the title,
    the command that reproduces it, the machine and `setting` (what ran, in a sentence or
    two), the generated `body`, then the hand-written analysis in notes.md, if any."""
    write_results(out, document)
    lines = [
        f"# {title}",
        "",
        "Reproduce with:",
        "",
        "```",
        document["command"],
        "```",
        "",
        f"Machine: {document['machine']}. {setting}",
        "",
        *body,
    ]
    write_readme(out, lines)


def pooled_document(options, run_cell: Callable, on_cell: Callable | None = None) -> dict:
    """A simulated benchmark's results: `run_cell` over every (profile, seed, options) of
    `options` in `options.workers` processes, with the command, the machine and the
    options (the paths, command and workers left out)."""
    jobs = [(name, seed, options) for name in options.profiles for seed in options.seeds]
    runs = run_pooled(run_cell, jobs, options.workers, on_cell)
    left_out = ("out_dir", "datasets_dir", "command", "workers")
    return {
        "command": options.command,
        "machine": machine_description(),
        "options": {k: v for k, v in asdict(options).items() if k not in left_out},
        "runs": runs,
    }


def rebuild(out_dir: Path, write: Callable[[Path, dict], None]) -> dict:
    """A benchmark's README.md again from `out_dir`'s results.json (after editing
    notes.md), by its own `write`."""
    document = json.loads((out_dir / "results.json").read_text())
    write(out_dir, document)
    return document


def write_readme(out: Path, lines: list[str]) -> None:
    """README.md from `lines` (ending in a blank one), then the hand-written analysis in
    notes.md beside it, if any, which a re-run keeps."""
    notes = out / "notes.md"
    if notes.exists():
        lines = [*lines, "## Notes", "", notes.read_text().strip(), ""]
    (out / "README.md").write_text("\n".join(lines))
