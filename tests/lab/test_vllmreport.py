"""The real-engine report judges each target on its worst trace and finds each run's steps."""

import pytest

from relstream.scheduler.data import StepKind
from relstream.scheduler.steprecord import StepLogStart, StepRecord
from relstream_lab.campaign.checkpoint import MachineSpeedError, check_speed, speed_against
from relstream_lab.campaign.run import offline_cost_lines, run_windows
from relstream_lab.campaign.targets import judge_targets


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
        StepRecord(
            kind=StepKind.MIXED,
            uncached_tokens=tokens,
            decode_requests=decodes,
            decode_context_tokens=context * decodes,
            duration_s=0.020 + 0.001 * tokens + 0.002 * decodes,
        )
        for tokens in (0, 64, 512, 2048)
        for decodes in (1, 8, 32, 128)
        for context in (50, 400)
    ]
    header = StepLogStart(
        limits={
            "max_num_seqs": 256,
            "max_num_batched_tokens": 2048,
            "kv_capacity_tokens": 46592,
            "block_size": 128,
        }
    )
    lines = offline_cost_lines(header, steps)
    assert lines == pytest.approx(
        {"alpha_p": 0.001, "beta_p": 0.020, "alpha_d": 0.002, "beta_d": 0.020}, rel=1e-6
    )


def test_each_run_finds_its_steps_walking_back_from_the_engines_last_step():
    # One engine served loads 0.4, 0.75 and 1.3 back to back; its last step ran at t=100.
    # Walking back: 1.3 took 30 s (70-100), 0.75 took 20 s (50-70), 0.4 took 40 s (10-50).
    records = [
        {"rate": 0.4, "makespan": 40.0},
        {"rate": 0.75, "makespan": 20.0},
        {"rate": 1.3, "makespan": 30.0},
    ]
    steps = [
        StepRecord(kind=StepKind.DECODE, uncached_tokens=0, decode_requests=1, duration_s=0.1, t=t)
        for t in (12.0, 49.0, 55.0, 100.0)
    ]
    assert run_windows(records, steps) == [(10.0, 50.0), (50.0, 70.0), (70.0, 100.0)]


def test_a_stored_window_is_taken_as_it_is():
    records = [{"rate": 0.4, "makespan": 40.0, "window": [3.0, 44.0]}]
    last = StepRecord(
        kind=StepKind.DECODE, uncached_tokens=0, decode_requests=1, duration_s=0.1, t=100.0
    )
    assert run_windows(records, [last]) == [(3.0, 44.0)]


# A capacity run's fit: 20 ms a step, 1 ms a prompt token, 2 ms a decode, 0 per context.
REFERENCE = {
    "base": 0.02,
    "per_uncached_token": 1e-3,
    "per_decode_request": 2e-3,
    "per_context_token": 0.0,
}


def step(tokens: int, decodes: int, seconds: float) -> StepRecord:
    return StepRecord(
        kind=StepKind.MIXED, uncached_tokens=tokens, decode_requests=decodes, duration_s=seconds
    )


def test_speed_is_real_step_time_over_what_the_capacity_runs_fit_predicts():
    # Predicted: 0.02 + 0.1 = 0.12 s and 0.02 + 0.02 = 0.04 s; real 0.24 and 0.08: 2x.
    assert speed_against(REFERENCE, [step(100, 0, 0.24), step(0, 10, 0.08)]) == pytest.approx(2.0)


def test_a_resumed_campaign_stops_on_a_machine_of_another_speed():
    check_speed(REFERENCE, [step(100, 0, 0.13)])  # 1.08x: the same kind of machine
    with pytest.raises(MachineSpeedError, match=r"2\.50x"):
        check_speed(REFERENCE, [step(100, 0, 0.30)])
