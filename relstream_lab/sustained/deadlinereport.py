"""The sustained benchmark's deadline report: attainment per policy per cell, and the
target that relstream meets at least as many deadlines as v1-fcfs, v1-priority and
relstream-no-deadlines on every run (`deadlines`: how they are set)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from relstream_lab.sustained.report import Verdict, _run_name
from relstream_lab.sustained.run import group

OURS = "relstream"
BLIND = "relstream-no-deadlines"  # relstream ignoring the deadlines
COMPARED = ("v1-fcfs", "v1-priority", BLIND)
TARGET = "deadline attainment vs v1-fcfs, v1-priority, relstream-no-deadlines"


def judge_deadlines(records: Sequence[dict]) -> list[Verdict]:
    """relstream's attainment at least that of each compared policy, on every run (value:
    its gain over the best of them, in points of attainment)."""
    verdicts = []
    for (profile, arrival, load), by_policy in sorted(group(records).items()):
        if not all(name in by_policy for name in (OURS, *COMPARED)):
            continue
        if "attainment" not in by_policy[OURS][0]:
            continue
        for index, ours in enumerate(by_policy[OURS]):
            best = max(by_policy[name][index]["attainment"] for name in COMPARED)
            gain = ours["attainment"] - best
            run = _run_name(profile, arrival, ours["seed"], load)
            verdicts.append(Verdict(TARGET, run, gain, gain >= 0))
    return verdicts


def markdown_deadlines(records: Sequence[dict]) -> list[str]:
    """Attainment per policy per (profile, arrival, load), mean over seeds [min-max],
    relstream's gain over the best compared policy, per seed, and what honouring the
    deadlines costs its mean and p99 latency."""
    grouped = group(records)
    keys = sorted(k for k, by in grouped.items() if "attainment" in by.get(OURS, [{}])[0])
    if not keys:
        return []
    names = [OURS, *COMPARED]
    lines = [
        "| profile | arrival | load | "
        + " | ".join(f"{name} (%)" for name in names)
        + " | gain over the best of the others (points) | relstream's mean, p99 over "
        "relstream-no-deadlines' |",
        "|---|---|---|" + "---|" * (len(names) + 2),
    ]
    for key in keys:
        by_policy = grouped[key]
        cells = [_spread([100 * r["attainment"] for r in by_policy[name]]) for name in names]
        gains = [
            100 * (ours["attainment"] - max(by_policy[name][i]["attainment"] for name in COMPARED))
            for i, ours in enumerate(by_policy[OURS])
        ]
        cells.append(_spread(gains, "{:+.1f}"))
        blind = zip(by_policy[OURS], by_policy[BLIND], strict=True)
        cost = [(o["mean"] / b["mean"], o["p99"] / b["p99"]) for o, b in blind]
        mean, p99 = (_spread([c[i] for c in cost], "{:.2f}") for i in (0, 1))
        cells.append(f"{mean}, {p99}")
        profile, arrival, load = key
        lines.append(f"| {profile} | {arrival} | {load:g} | " + " | ".join(cells) + " |")
    return lines


def _spread(values: Sequence[float], form: str = "{:.1f}") -> str:
    middle = form.format(statistics.fmean(values))
    if len(values) < 2:
        return middle
    return f"{middle} [{form.format(min(values))} – {form.format(max(values))}]"
