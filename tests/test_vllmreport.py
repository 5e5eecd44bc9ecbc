"""The real-engine report judges each target on its worst trace."""

from relstream.bench.vllmreport import judge_targets


def test_each_target_is_judged_on_its_worst_trace():
    rows = [
        {
            "arrival": "poisson",
            "seed": 0,
            "rate": 1.3,
            "v1-fcfs": 2.6,
            "v1-priority": 2.2,
            "relserve": 1.0,
            "max_vs_v1_fcfs": 1.3,
        },
        {
            "arrival": "gamma",
            "seed": 1,
            "rate": 1.3,
            "v1-fcfs": 2.2,
            "v1-priority": 1.7,
            "relserve": 0.9,
            "max_vs_v1_fcfs": 1.6,
        },
        {"arrival": "poisson", "seed": 0, "rate": 0.75, "v1-fcfs": 1.8, "v1-priority": 1.7},
    ]
    judged = {t["target"].split(": ")[1] + " @" + t["target"][:3]: t for t in judge_targets(rows)}
    top_fcfs = judged["v1-fcfs / relstream @top"]
    assert (top_fcfs["worst"], top_fcfs["worst_trace"], top_fcfs["holds"]) == (
        2.2,
        "gamma seed 1 at 1.3",
        False,
    )
    assert judged["v1-priority / relstream @top"]["holds"]  # worst 1.7 ≥ 1.6
    moderate = judged["v1-fcfs / relstream @mod"]
    assert (moderate["traces"], moderate["holds"]) == (1, True)  # 1.8 ≥ 1.4
    assert judged["relserve / relstream @eve"]["worst"] == 0.9  # < 0.95: misses
    assert not judged["relserve / relstream @eve"]["holds"]
    assert judged["relstream max / v1-fcfs max @eve"]["worst"] == 1.6  # over 1.5: misses
    assert not judged["relstream max / v1-fcfs max @eve"]["holds"]
