"""relstream's policy: its Δ, its work estimate and its regime test on cases computed by
hand, the step-cost fit, and whole runs on the simulator."""

from dataclasses import replace

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, EngineLimits, Linear, StepFeedback, StepKind
from relstream.scheduler.relstream import (
    Coefficients,
    Relstream,
    admission_pays,
    batching_is_free,
    prompt_allowance,
)
from relstream.scheduler.remaining import Remaining, expected_output, remaining
from relstream.scheduler.stepcost import OnlineStepCost
from relstream.scheduler.view import SeqInfo

# b = 20 ms per step, 1 ms per prompt token, 2 ms per decode; 10 requests running.
C = Coefficients(base=0.02, per_token=0.001, per_decode=0.002, batch=10)
RUNNING = [Remaining(rows=10, prompt_tokens=0, output_tokens=100, steps=10)]
CANDIDATE = Remaining(rows=5, prompt_tokens=500, output_tokens=50, steps=10)


def test_work_shares_the_step_base_only_where_batching_is_free():
    # Batching free (a GPU): 1 ms × 500 prompt tokens + (2 ms + 20 ms / 10) × 50 = 0.7 s
    assert replace(C, batching_free=True).work(CANDIDATE) == pytest.approx(0.7)
    # Held apart by the gate: 0.5 s of prompt + 20 ms × its own 10 steps + 2 ms × 50 = 0.8 s
    assert C.work(CANDIDATE) == pytest.approx(0.8)


def test_delta_keeps_the_running_set_alone_when_nobody_waits_behind():
    # Δ+ = 1 running relQuery × 0.5 s of prefill + 2 ms × 5 rows × 10 shared steps = 0.6
    # Δ- = 0.4 s the running set still takes alone − 0.2 s p would share = 0.2
    assert not admission_pays(RUNNING, CANDIDATE, behind=0, c=C)


def test_delta_admits_when_the_saved_steps_reach_the_queue():
    # Three relQueries behind p each save 10 shared steps × 20 ms = 0.6 s: Δ = 0.6 − 0.8
    assert admission_pays(RUNNING, CANDIDATE, behind=3, c=C)


def test_an_idle_engine_always_admits():
    assert admission_pays([], CANDIDATE, behind=0, c=C)


def test_rows_are_expected_to_answer_like_their_finished_siblings():
    view = ScriptedView(EngineLimits(8, 100, 1000, 4))
    ids = view.add_relquery("q", [10, 10, 10, 10], max_tokens=10)
    info = view.tracker.relqueries["q"]
    assert expected_output(info) == 10  # nothing finished yet: the whole budget
    for request_id, generated in zip(ids[:2], (3, 4), strict=True):
        view.start(request_id)
        view.tracker.record_progress(view.tracker.running[request_id], generated=generated - 1)
        view.tracker.finish(request_id)
    assert expected_output(info) == 4  # (3 + 4) / 2 = 3.5, rounded half to even
    left = remaining(info)
    assert (left.rows, left.prompt_tokens, left.output_tokens, left.steps) == (2, 20, 8, 4)


def test_rows_still_on_their_way_count_like_the_rows_seen():
    # A 40-row relQuery whose first 2 rows (12 and 8 prompt tokens) have reached the engine
    # is ranked as 40 rows: 38 more of 10 prompt tokens and 5 output tokens each.
    view = ScriptedView(EngineLimits(8, 100, 1000, 4))
    for row, prompt in enumerate((12, 8)):
        view.tracker.add_request(SeqInfo(f"a#{row}", "a", prompt, 5, 0.0), relquery_size=40)
    left = remaining(view.tracker.relqueries["a"])
    assert (left.rows, left.prompt_tokens, left.output_tokens, left.steps) == (40, 400, 200, 5)


def test_the_regime_comes_from_the_fitted_cost_and_the_limits():
    limits = EngineLimits(
        max_num_seqs=256, max_num_batched_tokens=2048, kv_capacity_tokens=10_000, block_size=16
    )
    view = ScriptedView(limits)
    view.add_relquery("q", [80, 80], max_tokens=20)  # 100 tokens a request: 100 fit in KV
    gpu = Coefficients(base=0.021, per_token=0.0002, per_decode=0.0001, batch=1)
    cpu = Coefficients(base=0.025, per_token=0.001, per_decode=0.0025, batch=1)
    assert batching_is_free(view, gpu)  # 100 × 0.1 ms = 10 ms < 21 ms
    assert not batching_is_free(view, cpu)  # 100 × 2.5 ms = 250 ms > 25 ms


def true_step(tokens: int, decodes: int, context: int) -> float:
    return 0.025 + 0.001 * tokens + 0.002 * decodes + 0.000005 * context


def test_the_step_cost_learns_a_line_from_mixed_steps():
    cost = OnlineStepCost(base=0.1, per_token=0.0, per_decode=0.0)
    for step in range(200):
        tokens, decodes = (step * 37) % 1500, (step * 11) % 90
        context = decodes * ((step * 7) % 300)
        kind = StepKind.of(bool(tokens), bool(decodes))
        duration = true_step(tokens, decodes, context)
        cost.observe(StepFeedback(kind, tokens, decodes, duration, context))
    assert cost.coefficients() == pytest.approx((0.025, 0.001, 0.002, 0.000005), rel=0.02)


def test_steps_that_cannot_tell_costs_apart_leave_the_fit_alone():
    cost = OnlineStepCost(base=0.025, per_token=0.001, per_decode=0.002, per_context=0.000005)
    for step in range(600):  # one batch size, one context: base and per-decode collinear
        noise = 0.003 * ((step * 7919) % 11 - 5) / 5
        duration = true_step(0, 40, 8000) + noise
        cost.observe(StepFeedback(StepKind.DECODE, 0, 40, duration, 8000))
    base, _, per_decode, _ = cost.coefficients()
    assert base == pytest.approx(0.025, rel=0.2) and per_decode == pytest.approx(0.002, rel=0.2)


def test_relstream_finishes_the_smaller_relquery_first():
    # Per-request-bound costs (this CPU's regime): the 2-row relQuery arriving second
    # is admitted before the 20-row one, which keeps waiting: Δ+ = 1 s of its prefill
    # + 2.5 ms × 20 rows × 20 shared steps = 2 s against Δ- = 0.7 − 0.1 = 0.6 s.
    limits = EngineLimits(
        max_num_seqs=64, max_num_batched_tokens=512, kv_capacity_tokens=100_000, block_size=16
    )
    view = ScriptedView(limits)
    view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0)
    view.add_relquery("small", [50] * 2, max_tokens=20, arrival=0.1)
    cost = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))
    plan = Relstream(cost).plan(view)
    assert [chunk.request_id for chunk in plan.prefill] == ["small#0", "small#1"]


# b = 25 ms, a_p = 1 ms, a_d = 2.5 ms; a 512-token budget.
SMALL_COST = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))


def long_prompt_then_short(computed: int) -> ScriptedView:
    """ "long" (one row of 1,000 prompt tokens, `computed` done) runs; "short" (50) just
    arrived."""
    limits = EngineLimits(
        max_num_seqs=64, max_num_batched_tokens=512, kv_capacity_tokens=100_000, block_size=16
    )
    view = ScriptedView(limits)
    view.add_relquery("long", [1000], max_tokens=20, arrival=0.0)
    view.tracker.record_progress(view.tracker.start("long#0"), computed=computed)
    view.add_relquery("short", [50], max_tokens=20, arrival=1.0)
    return view


def test_a_better_ranked_relquery_gets_the_prompt_budget_before_a_long_prompt_in_flight():
    # "long" has 800 prompt tokens still to compute (W ≥ 0.8 s); "short" (W ≈ 0.1 s)
    # ranks first and takes 50 tokens of the 512-token budget. vLLM would compute the
    # running prompt first, so the long one, which no longer fits whole in the 462 left,
    # waits this step instead of taking all 512.
    plan = Relstream(SMALL_COST).plan(long_prompt_then_short(computed=200))
    assert [(chunk.request_id, chunk.num_tokens) for chunk in plan.prefill] == [("short#0", 50)]


def test_a_running_prompt_that_fits_whole_continues_beside_a_better_ranked_one():
    # As above, but only 300 tokens of "long" are left: they fit in the 462 after
    # "short", so both are computed this step.
    plan = Relstream(SMALL_COST).plan(long_prompt_then_short(computed=700))
    assert {chunk.request_id: chunk.num_tokens for chunk in plan.prefill} == {
        "short#0": 50,
        "long#0": 300,
    }


def test_a_prompt_joins_better_ranked_decodes_only_as_far_as_the_saved_base_pays():
    # b = 20 ms, a_p = 1 ms: two better-ranked relQueries decoding, three queued behind:
    # 20 ms × (1 + 3) / (1 ms × 2) = 40 tokens. No limit with nobody decoding ahead, or
    # where batching is free.
    assert prompt_allowance(2, 3, C) == 40
    assert prompt_allowance(0, 3, C) is None
    assert prompt_allowance(2, 3, replace(C, batching_free=True)) is None


def test_a_long_prompt_waits_while_a_better_ranked_relquery_decodes():
    # "short" decodes; "long" has 800 prompt tokens left. Its allowance is 25 ms / 1 ms =
    # 25 tokens, so it waits instead of stretching short's 25 ms step by 0.5 s.
    view = long_prompt_then_short(computed=200)
    view.start("short#0")
    plan = Relstream(SMALL_COST).plan(view)
    assert plan.decode == ("short#0",) and plan.prefill == ()
