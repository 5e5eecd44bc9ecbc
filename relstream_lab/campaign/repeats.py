"""Real-engine campaigns run more than once, side by side: each cell's runs across
campaign folders, their spread, and the scheduler issue's lines judged on every run and
on the mean over the repeats.

A campaign's checkpoint holds one run per policy and cell, so a repeat is a campaign of
its own (its own --out); this reads their results.json files (written by the campaign's
report) and changes none of them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from relstream_lab.campaign.targets import (
    FIDELITY_TARGET,
    fidelity,
    judge_targets,
    ratios,
    target_table,
)

Cell = tuple[str, int, float]  # arrival, seed, load


def load_repeats(folders: list[Path]) -> list[dict]:
    """Every reported run of each campaign folder, tagged with its folder's name."""
    runs = []
    for folder in folders:
        document = json.loads((folder / "results.json").read_text())
        runs += [{**run, "campaign": folder.name} for run in document["runs"]]
    return runs


def _cells(runs: list[dict]) -> dict[Cell, dict[str, list[dict]]]:
    cells: dict[Cell, dict[str, list[dict]]] = {}
    for run in runs:
        cell = (run["arrival"], run["seed"], run["rate"])
        cells.setdefault(cell, {}).setdefault(run["policy"], []).append(run)
    return dict(sorted(cells.items()))


def mean_runs(runs: list[dict]) -> list[dict]:
    """One run per policy and cell: mean, max and makespan averaged over its repeats."""
    averaged = []
    for (arrival, seed, load), policies in _cells(runs).items():
        for policy, repeats in policies.items():
            averaged.append(
                {
                    "arrival": arrival,
                    "seed": seed,
                    "rate": load,
                    "policy": policy,
                    **{
                        key: statistics.fmean(r[key] for r in repeats)
                        for key in ("mean", "max", "makespan")
                    },
                }
            )
    return averaged


def _spread(values: list[float], digits: int) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (
        f"{statistics.fmean(values):.{digits}f} "
        f"({min(values):.{digits}f}–{max(values):.{digits}f}, "
        f"{(max(values) - min(values)) / statistics.fmean(values):.0%})"
    )


def repeats_lines(folders: list[Path]) -> list[str]:
    """The side-by-side report as markdown lines."""
    runs = load_repeats(folders)
    names = sorted({run["campaign"] for run in runs})
    lines = [
        f"Campaigns: {', '.join(f'`{name}`' for name in names)}.",
        "",
        "## Each cell: the mean over its runs (min–max, spread as a share of the mean)",
        "",
        "| arrival | seed | load | policy | runs | mean (s) | makespan (s) | max (s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (arrival, seed, load), policies in _cells(runs).items():
        for policy, repeats in policies.items():
            lines.append(
                f"| {arrival} | {seed} | {load:g} | {policy} | {len(repeats)} | "
                f"{_spread([r['mean'] for r in repeats], 1)} | "
                f"{_spread([r['makespan'] for r in repeats], 0)} | "
                f"{_spread([r['max'] for r in repeats], 0)} |"
            )
    lines += [
        "",
        "## Each run against stock V1 (baseline mean / relstream's; makespan and max: "
        "relstream's over the baseline's)",
        "",
        "| campaign | arrival | seed | load | v1-fcfs | v1-priority | makespan / better V1 "
        "| max / v1-fcfs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    every_row = []
    for name in names:
        for row in ratios([run for run in runs if run["campaign"] == name]):
            every_row.append(row)
            makespan = row.get("makespan_vs_best_v1")
            lines.append(
                f"| {name} | {row['arrival']} | {row['seed']} | {row['rate']:g} | "
                f"{_times(row.get('v1-fcfs'))} | {_times(row.get('v1-priority'))} | "
                f"{'–' if makespan is None else f'{makespan - 1:+.1%}'} | "
                f"{_times(row.get('max_vs_v1_fcfs'))} |"
            )
    lines += [
        "",
        "## The issue's lines, on every run (each on its worst run)",
        "",
        *target_table(judge_targets(every_row), "runs", 3),
        "",
        "## The issue's lines, on the mean over each cell's runs",
        "",
        *target_table(judge_targets(ratios(mean_runs(runs))), "cells", 3),
        "",
        "## The simulator's replays (each run with its own steps' line; one profile per "
        "campaign epoch)",
        "",
        "| campaign | policy | seed | load | mean error | makespan error | one profile: mean "
        "| makespan |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        errors = [
            run.get(key, float("nan"))
            for key in (
                "prediction_error",
                "makespan_prediction_error",
                "prediction_error_one_profile",
                "makespan_prediction_error_one_profile",
            )
        ]
        lines.append(
            f"| {run['campaign']} | {run['policy']} | {run['seed']} | {run['rate']:g} | "
            + " | ".join(f"{e:+.0%}" for e in errors)
            + " |"
        )
    # `fidelity` per campaign: its side-of-stock-V1 pairs are taken inside one campaign.
    within = sum(
        fidelity([run for run in runs if run["campaign"] == name])["within_target"]
        for name in names
    )
    lines += [
        "",
        f"Within {FIDELITY_TARGET:.0%} on both mean and makespan (own line): {within} of "
        f"{len(runs)} runs.",
        "",
    ]
    return lines


def _times(ratio: float | None) -> str:
    """A ratio as "1.23x"; "–" where the policies to compare did not both run (a pair)."""
    return "–" if ratio is None else f"{ratio:.2f}x"
