"""relstream's policy: its work estimate, its order inside V1's batches and its
starvation guard on cases computed by hand, and the step-cost fit."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, Linear
from relstream.scheduler.data import EngineLimits, SeqInfo, StepFeedback, StepKind
from relstream.scheduler.paperlines import Coefficients
from relstream.scheduler.relstream_policy import RelstreamConfig
from relstream.scheduler.remaining import Remaining, expected_output, remaining
from relstream.scheduler.stepcost import OnlineStepCost
from relstream_lab.policies import RelstreamUngated  # V1's batches: the order alone under test

# b = 20 ms per step, 1 ms per prompt token, 2 ms per decode; 10 requests running.
C = Coefficients(base=0.02, per_token=0.001, per_decode=0.002, batch=10)
CANDIDATE = Remaining(rows=5, prompt_tokens=500, output_tokens=50, steps=10)


def test_work_shares_the_step_base_with_the_batch():
    # 1 ms × 500 prompt tokens + (2 ms + 20 ms / 10 running) × 50 output tokens = 0.7 s
    assert C.work(CANDIDATE) == pytest.approx(0.7)


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


def test_a_stalled_prompt_step_does_not_price_every_prompt_token():
    # Decode steps of 10-40 requests, every eighth a 100-token prompt step among them; two
    # prompt steps stall 2 s (the process descheduled). Taken at face value they would add
    # 2 × 2 s / (64 prompt steps × 100 tokens) = 0.6 ms to every token's 1 ms.
    cost = OnlineStepCost(base=0.025, per_token=0.001, per_decode=0.002, per_context=0.000005)
    for step in range(512):
        tokens, decodes = (100 if step % 8 == 0 else 0), 10 + step % 31
        duration = true_step(tokens, decodes, decodes * 200)
        if step in (200, 400):
            duration += 2.0
        kind = StepKind.of(bool(tokens), bool(decodes))
        cost.observe(StepFeedback(kind, tokens, decodes, duration, decodes * 200))
    assert cost.coefficients() == pytest.approx((0.025, 0.001, 0.002, 0.000005), rel=0.02)


def test_steps_that_cannot_tell_costs_apart_leave_the_fit_alone():
    cost = OnlineStepCost(base=0.025, per_token=0.001, per_decode=0.002, per_context=0.000005)
    for step in range(600):  # one batch size, one context: base and per-decode collinear
        noise = 0.003 * ((step * 7919) % 11 - 5) / 5
        duration = true_step(0, 40, 8000) + noise
        cost.observe(StepFeedback(StepKind.DECODE, 0, 40, duration, 8000))
    base, _, per_decode, _ = cost.coefficients()
    assert base == pytest.approx(0.025, rel=0.2) and per_decode == pytest.approx(0.002, rel=0.2)


def small_engine(seats: int = 64, budget: int = 512) -> ScriptedView:
    return ScriptedView(
        EngineLimits(
            max_num_seqs=seats,
            max_num_batched_tokens=budget,
            kv_capacity_tokens=100_000,
            block_size=16,
        )
    )


# b = 25 ms, a_p = 1 ms, a_d = 2.5 ms.
SMALL_COST = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))


def test_the_smaller_relquery_is_admitted_first_and_the_budget_still_filled():
    # W(big) = 1 ms × 1,000 + (2.5 ms + 25 ms) × 400 = 12 s; W(small) = 0.1 + 1.1 = 1.2 s.
    # small's two rows go first, then big's rows fill the 512-token budget as V1 would:
    # 412 tokens left = 8 whole prompts of 50 and 12 tokens of the ninth.
    view = small_engine()
    view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0)
    view.add_relquery("small", [50] * 2, max_tokens=20, arrival=0.1)
    plan = RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(view)
    ids = [chunk.request_id for chunk in plan.prefill]
    assert ids == ["small#0", "small#1", *(f"big#{row}" for row in range(9))]
    assert [chunk.num_tokens for chunk in plan.prefill][-1] == 12
    assert sum(chunk.num_tokens for chunk in plan.prefill) == 512


def test_a_later_smaller_relquery_goes_first_only_while_its_rank_has_not_aged_past():
    # Nothing running (n = 1): W(big) = 1 ms × 1,000 + 27.5 ms × 400 = 12 s and
    # W(small) = 0.1 + 27.5 ms × 40 = 1.2 s. With γ = 1 big's rank is 0 + 12 = 12; small
    # arriving at 10 s ranks 10 + 1.2 = 11.2 (first), at 11 s 11 + 1.2 = 12.2 (second).
    config = RelstreamConfig(fcfs_slack=float("inf"), size_weight=1.0)
    for arrival, first in ((10.0, "small#0"), (11.0, "big#0")):
        view = small_engine(seats=20)
        view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0)
        view.add_relquery("small", [50] * 2, max_tokens=20, arrival=arrival)
        view.clock = arrival
        plan = RelstreamUngated(SMALL_COST, config).plan(view)
        assert plan.prefill[0].request_id == first


def test_a_relquery_past_its_fcfs_deadline_goes_ahead_of_smaller_ones():
    # b = 25 ms, a_p = 1 ms, a_d = 2.5 ms, nothing running (n = 1): W(big) = 1 ms × 1,000
    # + 27.5 ms × 400 = 12 s. FCFS would answer it in its own 12 s (nothing came before
    # it), so with a slack of 1 its deadline is 12 s. At 0 s no KV is free: it waits.
    policy = RelstreamUngated(SMALL_COST, RelstreamConfig(fcfs_slack=1.0))
    view = small_engine(seats=20)
    view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0)
    view.free_tokens = 0
    assert policy.plan(view).prefill == ()
    # At 11 s "small" (W = 0.1 + 27.5 ms × 40 = 1.2 s) ranks first; big's rows fill the
    # rest of the 512-token budget.
    view.free_tokens = 10**9
    view.add_relquery("small", [50] * 2, max_tokens=20, arrival=11.0)
    view.clock = 11.0
    assert [c.request_id for c in policy.plan(view).prefill][:3] == ["small#0", "small#1", "big#0"]
    # At 13 s big is past its deadline: its rows take the whole budget (10 prompts of 50
    # and 12 tokens of the eleventh) ahead of small.
    view.clock = 13.0
    ids = [c.request_id for c in policy.plan(view).prefill]
    assert ids == [f"big#{row}" for row in range(11)]


def test_a_full_cache_evicts_the_worst_ranked_relquerys_last_row():
    # Blocks of 16 tokens, 2 free. Every row holds 16 computed tokens in one block, so
    # each decode needs a second block. relstream runs small first (best rank), then
    # big#0; big#1, ranked last, finds no block and is itself the victim: it is
    # evicted and the running pass ends, as in V1.
    view = small_engine()
    view.add_relquery("big", [16, 16], max_tokens=50)
    view.add_relquery("small", [16], max_tokens=5)
    for request_id in ("big#0", "big#1", "small#0"):
        view.start(request_id)
    view.free_tokens = 32
    plan = RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(view)
    assert plan.decode == ("small#0", "big#0") and plan.preempt == ("big#1",)
    assert plan.prefill == ()


def test_a_relquery_whose_prompts_are_cached_ranks_first():
    # Twins of 4 rows of 100 prompt tokens, 5 output tokens each: W = 1 ms × 400 +
    # 27.5 ms × 20 = 0.95 s. 96 tokens of each of "late"'s prompts are in the prefix
    # cache: its P is 4 % of 400, W = 0.016 + 0.55 s, so it goes first though it came
    # second, with one seat left after it for "early".
    view = small_engine(seats=5)
    view.add_relquery("early", [100] * 4, max_tokens=5, arrival=0.0)
    view.add_relquery("late", [100] * 4, max_tokens=5, arrival=1.0)
    view.cached.update({f"late#{row}": 96 for row in range(4)})
    plan = RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(view)
    assert [c.request_id for c in plan.prefill] == [*(f"late#{r}" for r in range(4)), "early#0"]
