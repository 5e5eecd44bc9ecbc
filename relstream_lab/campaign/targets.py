"""The scheduler issue's "done when" lines, judged on a real-engine campaign's runs:
relstream's mean against each baseline per trace and load, each target on its worst
trace, and how closely the simulator's replays land."""

from __future__ import annotations

from dataclasses import dataclass

OURS = "relstream"
BASELINES = ("v1-fcfs", "v1-priority", "relserve")
STOCK_V1 = ("v1-fcfs", "v1-priority")
FIDELITY_TARGET = 0.15


def ratios(runs: list[dict]) -> list[dict]:
    """Per trace and load: each baseline's mean over relstream's (above 1: relstream is
    faster), the better stock V1's mean over relstream's, relstream's max over
    `v1-fcfs`'s, and relstream's makespan over the better stock V1's."""
    rows = []
    keyed = {(r["arrival"], r["seed"], r["rate"], r["policy"]): r for r in runs}
    for arrival, seed, load, policy in sorted(keyed):
        if policy != OURS:
            continue
        ours = keyed[(arrival, seed, load, OURS)]
        row = {"arrival": arrival, "seed": seed, "rate": load}
        for baseline in BASELINES:
            other = keyed.get((arrival, seed, load, baseline))
            if other:
                row[baseline] = other["mean"] / ours["mean"]
        fcfs = keyed.get((arrival, seed, load, "v1-fcfs"))
        if fcfs:
            row["max_vs_v1_fcfs"] = ours["max"] / fcfs["max"]
        stock = [keyed[key] for p in STOCK_V1 if (key := (arrival, seed, load, p)) in keyed]
        if len(stock) == len(STOCK_V1):
            row["best_v1_mean"] = min(r["mean"] for r in stock) / ours["mean"]
            row["makespan_vs_best_v1"] = ours["makespan"] / min(r["makespan"] for r in stock)
        rows.append(row)
    return rows


@dataclass(frozen=True)
class Target:
    """One "done when" line of the scheduler issue, judged on its worst trace."""

    label: str
    baseline: str  # a key of a `ratios` row
    loads: tuple[float, float]  # the loads it covers, inclusive
    bound: float
    at_most: bool = False  # the ratio must stay at or below `bound` (else at or above)


TARGETS = (
    Target("top load (≥1.2): v1-fcfs / relstream", "v1-fcfs", (1.2, 99.0), 2.3),
    Target("top load (≥1.2): v1-priority / relstream", "v1-priority", (1.2, 99.0), 1.6),
    Target("moderate load (0.6-0.9): v1-fcfs / relstream", "v1-fcfs", (0.6, 0.9), 1.5),
    Target("moderate load (0.6-0.9): v1-priority / relstream", "v1-priority", (0.6, 0.9), 1.5),
    Target(
        "moderate load (0.6-0.9): relstream makespan / better stock V1's",
        "makespan_vs_best_v1",
        (0.6, 0.9),
        1.05,
        True,
    ),
    Target("full load (0.95-1.1): better stock V1 / relstream", "best_v1_mean", (0.95, 1.1), 1.0),
    Target(
        "full load (0.95-1.1): relstream makespan / better stock V1's",
        "makespan_vs_best_v1",
        (0.95, 1.1),
        1.03,
        True,
    ),
    Target("every load: relserve / relstream", "relserve", (0.0, 99.0), 0.95),
    Target("every load: relstream max / v1-fcfs max", "max_vs_v1_fcfs", (0.0, 99.0), 1.5, True),
)


def judge_targets(ratio_rows: list[dict]) -> list[dict]:
    """Each target's worst trace among those measured, and whether it holds there."""
    judged = []
    for target in TARGETS:
        low, high = target.loads
        covered = [
            (row[target.baseline], row)
            for row in ratio_rows
            if target.baseline in row and low <= row["rate"] <= high
        ]
        if not covered:
            judged.append({"target": target.label, "traces": 0})
            continue
        pick = max if target.at_most else min
        worst, row = pick(covered, key=lambda pair: pair[0])
        holds = worst <= target.bound if target.at_most else worst >= target.bound
        judged.append(
            {
                "target": target.label,
                "bound": target.bound,
                "traces": len(covered),
                "worst": worst,
                "worst_trace": f"{row['arrival']} seed {row['seed']} at {row['rate']:g}",
                "holds": holds,
            }
        )
    return judged


def target_table(judged: list[dict], counted: str = "traces", digits: int = 2) -> list[str]:
    """`judge_targets`' verdicts as a markdown table, the targets no trace covers left out;
    `counted` names what the third column counts."""
    return [
        f"| target | bound | {counted} | worst | where | holds |",
        "|---|---|---|---|---|---|",
        *(
            f"| {t['target']} | {t['bound']:g}x | {t['traces']} | {t['worst']:.{digits}f}x | "
            f"{t['worst_trace']} | {'yes' if t['holds'] else '**no**'} |"
            for t in judged
            if t["traces"]
        ),
    ]


def fidelity(runs: list[dict], suffix: str = "") -> dict:
    """How many replays land within the target on the mean and on the makespan (both,
    for `within_target`), and in how many (trace, load, stock V1 policy) comparisons the
    replays put relstream on the same side of the stock policy as the real runs did, on
    the mean and on the makespan; `suffix` "_one_profile" for the replays that share one
    profile."""
    replayed = [r for r in runs if f"prediction_error{suffix}" in r]
    means = [abs(r[f"prediction_error{suffix}"]) for r in replayed]
    makespans = [abs(r[f"makespan_prediction_error{suffix}"]) for r in replayed]
    keyed = {(r["arrival"], r["seed"], r["rate"], r["policy"]): r for r in replayed}
    pairs = [
        (ours, other)
        for (arrival, seed, load, policy), ours in keyed.items()
        if policy == OURS
        for stock in STOCK_V1
        if (other := keyed.get((arrival, seed, load, stock)))
    ]
    signs = [
        (ours[real] < other[real])
        == (ours[f"predicted_{real}{suffix}"] < other[f"predicted_{real}{suffix}"])
        for ours, other in pairs
        for real in ("mean", "makespan")
    ]
    return {
        "target": FIDELITY_TARGET,
        "runs": len(means),
        "within_target": sum(
            1 for m, k in zip(means, makespans, strict=True) if max(m, k) <= FIDELITY_TARGET
        ),
        "max_abs_error": max(means, default=float("nan")),
        "max_abs_makespan_error": max(makespans, default=float("nan")),
        "comparisons": len(signs),
        "right_sign": sum(signs),
    }
