"""The real-engine report judges each target on its worst trace and finds each run's steps."""

import pytest

from relstream.model import RelQuery, Row, Template
from relstream.scheduler.data import EngineLimits, StepFeedback, StepKind
from relstream.scheduler.steprecord import StepLogStart, StepRecord
from relstream.sim.profiles import LinearProfile
from relstream_lab.campaign import frontier, report
from relstream_lab.campaign.busy import BusyTime, gap_line
from relstream_lab.campaign.checkpoint import MachineSpeedError, check_speed, speed_against
from relstream_lab.campaign.run import alternated, offline_cost_lines, run_windows
from relstream_lab.campaign.targets import fidelity, judge_targets, ratios
from relstream_lab.common.workload import TraceConfig, TraceEntry, tokenize_trace


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
    assert (moderate["traces"], moderate["holds"]) == (1, True)  # 1.8 ≥ 1.5
    assert judged["relserve / relstream @eve"]["worst"] == 0.9  # < 0.95: misses
    assert not judged["relserve / relstream @eve"]["holds"]
    assert judged["relstream max / v1-fcfs max @eve"]["worst"] == 1.6  # over 1.5: misses
    assert not judged["relstream max / v1-fcfs max @eve"]["holds"]


def _run(policy, load, mean, makespan, **predicted):
    return {"arrival": "poisson", "seed": 1, "rate": load, "policy": policy, "mean": mean,
            "max": 2 * mean, "makespan": makespan, **predicted}  # fmt: skip


def test_the_makespan_lines_take_the_better_stock_v1():
    runs = [
        _run("relstream", 0.75, 30.0, 600.0),
        _run("v1-fcfs", 0.75, 45.0, 564.0),
        _run("v1-priority", 0.75, 46.0, 580.0),
        _run("relstream", 1, 35.0, 500.0),
        _run("v1-fcfs", 1, 87.0, 510.0),
        _run("v1-priority", 1, 70.0, 490.0),
    ]
    rows = {row["rate"]: row for row in ratios(runs)}
    assert rows[0.75]["makespan_vs_best_v1"] == 600.0 / 564.0  # +6.4 %: over 5 %
    assert rows[0.75]["best_v1_mean"] == 1.5
    assert rows[1]["makespan_vs_best_v1"] == 500.0 / 490.0  # +2.0 %: within 3 %
    assert rows[1]["best_v1_mean"] == 2.0
    judged = {t["target"]: t for t in judge_targets(list(rows.values()))}
    assert not judged["moderate load (0.6-0.9): relstream makespan / better stock V1's"]["holds"]
    assert judged["full load (0.95-1.1): relstream makespan / better stock V1's"]["holds"]
    assert judged["full load (0.95-1.1): better stock V1 / relstream"]["holds"]


def test_fidelity_needs_mean_and_makespan_within_the_target_and_counts_the_sides():
    def replayed(policy, mean, makespan, predicted_mean, predicted_makespan):
        return _run(
            policy, 1, mean, makespan,
            predicted_mean=predicted_mean, predicted_makespan=predicted_makespan,
            prediction_error=predicted_mean / mean - 1,
            makespan_prediction_error=predicted_makespan / makespan - 1,
        )  # fmt: skip

    runs = [
        replayed("relstream", 40.0, 500.0, 44.0, 510.0),  # +10 %, +2 %: within
        replayed("v1-fcfs", 80.0, 510.0, 84.0, 600.0),  # +5 %, +17.6 %: not within
        replayed("v1-priority", 70.0, 490.0, 50.0, 520.0),  # -28.6 %: not within
    ]
    fid = fidelity(runs)
    assert (fid["runs"], fid["within_target"]) == (3, 1)
    assert fid["max_abs_error"] == pytest.approx(20.0 / 70.0)
    assert fid["max_abs_makespan_error"] == pytest.approx(90.0 / 510.0)
    # Means: relstream below both, really and replayed (2 right). Makespans: below
    # v1-fcfs in both (right); above v1-priority really (500 > 490), below it replayed
    # (510 < 520: wrong).
    assert (fid["comparisons"], fid["right_sign"]) == (4, 3)


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


def test_each_cell_runs_the_policies_one_place_rotated():
    policies = ("relstream", "v1-fcfs", "v1-priority")
    assert [alternated(policies, cell)[0] for cell in range(4)] == [
        "relstream", "v1-fcfs", "v1-priority", "relstream",
    ]  # fmt: skip
    assert alternated(policies, 1) == ["v1-fcfs", "v1-priority", "relstream"]


def _rating_trace(ids: tuple[str, ...]):
    """q1 rates Dune and Emma; q2 rates Emma alone: one request the engine shares."""
    dune, emma = Row("1", {"title": "Dune"}), Row("2", {"title": "Emma"})
    relqueries = [
        RelQuery("q1", Template("Rate {title}."), [dune, emma], 8),
        RelQuery("q2", Template("Rate {title}."), [emma], 8),
    ]
    entries = [TraceEntry(rq, "t", "rating") for rq in relqueries if rq.id in ids]
    return tokenize_trace(entries, TraceConfig(), {"q1": [3, 6], "q2": [6]})


TINY = LinearProfile(
    "tiny",
    EngineLimits(
        max_num_seqs=8, max_num_batched_tokens=512, kv_capacity_tokens=4096, block_size=16
    ),
    0.001,
    0.01,
    0.001,
    0.01,
)


def test_the_replay_shares_identical_requests_as_the_campaigns_engine_did():
    def replay(shares: str, ids: tuple[str, ...]):
        run = {"policy": "v1-fcfs", "rate": 1.0}
        sharing = report.engine_sharing({"engine_shares": shares})
        return report._replay(_rating_trace(ids), TINY, run, 1.0, sharing)

    alone = replay("none", ("q1",))
    shared, unshared = replay("in-flight", ("q1", "q2")), replay("none", ("q1", "q2"))
    assert shared.makespan == pytest.approx(alone.makespan)  # q2's Emma follows q1's
    assert unshared.makespan > shared.makespan  # a third request decodes in every step
    assert report.engine_sharing({}) == report.SHARING["none"]  # campaigns before 92a4eff


def test_the_frontier_shares_work_as_the_campaigns_engine_did():
    both = _rating_trace(("q1", "q2")).at_rate(1.0, 16)
    alone = _rating_trace(("q1",)).at_rate(1.0, 16)
    shared = frontier.run(TINY, both, "v1-fcfs", sharing=report.SHARING["in-flight"])
    assert shared.makespan == pytest.approx(frontier.run(TINY, alone, "v1-fcfs").makespan)
    assert frontier.run(TINY, both, "v1-fcfs").makespan > shared.makespan


def test_busy_time_splits_into_the_step_costs_terms():
    profile = LinearProfile("split", TINY.limits, 0.001, 0.02, 0.003, 0.01, 0.0001)
    busy = BusyTime()
    for tokens, decodes, context in ((100, 4, 400), (0, 4, 404)):
        seconds = profile.step_time(tokens, decodes, context)
        busy.add(profile, StepFeedback(StepKind.MIXED, tokens, decodes, seconds, context))
    # bases: max(0.02, 0.01) then 0.01; prompt 100 × 0.001; decodes 8 × 0.003; context 804 × 0.0001
    assert busy.terms == pytest.approx(
        {"base": 0.03, "prompt": 0.1, "decode": 0.024, "context": 0.0804}
    )
    assert (busy.steps, busy.decodes, busy.seconds) == (2, 8, pytest.approx(0.2344))


def test_the_frontiers_busy_time_is_the_runs_and_shows_the_shared_decodes():
    both = _rating_trace(("q1", "q2")).at_rate(1.0, 16)
    shared, unshared = BusyTime(), BusyTime()
    frontier.run(TINY, both, "v1-fcfs", sharing=report.SHARING["in-flight"], busy=shared)
    frontier.run(TINY, both, "v1-fcfs", busy=unshared)
    for book in (shared, unshared):
        assert sum(book.terms.values()) == pytest.approx(book.seconds)
    # q1's rows decode 2 + 5 times (the first token comes with the prompt); unshared, q2's
    # Emma decodes her 5 again and computes her prompt again
    assert (shared.decodes, unshared.decodes) == (7, 12)
    assert unshared.terms["prompt"] > shared.terms["prompt"]
    line = gap_line("unshared", unshared, "shared", shared)
    assert line.startswith("| unshared | shared | +") and line.endswith("| 12 / 7 |")
