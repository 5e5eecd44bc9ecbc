"""The real-engine report judges each target on its worst trace."""

import pytest

from relstream.bench.vllmbench import offline_cost_lines
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


def test_relserves_offline_lines_come_from_the_capacity_runs_steps():
    # Steps on an exact plane: 20 ms + 1 ms per prompt token + 2 ms per decode, whatever
    # the context.
    steps = [
        {
            "kind": "mixed",
            "uncached_tokens": tokens,
            "decode_requests": decodes,
            "decode_context_tokens": context * decodes,
            "duration_s": 0.020 + 0.001 * tokens + 0.002 * decodes,
        }
        for tokens in (0, 64, 512, 2048)
        for decodes in (1, 8, 32, 128)
        for context in (50, 400)
    ]
    header = {
        "limits": {
            "max_num_seqs": 256,
            "max_num_batched_tokens": 2048,
            "kv_capacity_tokens": 46592,
            "block_size": 128,
        }
    }
    lines = offline_cost_lines(header, steps)
    assert lines == pytest.approx(
        {"alpha_p": 0.001, "beta_p": 0.020, "alpha_d": 0.002, "beta_d": 0.020}, rel=1e-6
    )
