"""Priority classes (`scheduler.classes`): a higher class ranked first, the starvation
guard within a class, and a full engine's lower-class rows preempted for a higher class,
on cases computed by hand."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, Linear, vllm_priority
from relstream.scheduler.classes import (
    BACKGROUND_MIN_TOKENS,
    BACKGROUND_STEP_S,
    MAKE_WAY_ROWS,
    within_slowdown,
)
from relstream.scheduler.data import EngineLimits, PrefillChunk, StepPlan
from relstream.scheduler.paperlines import Coefficients
from relstream.scheduler.relstream_policy import Relstream
from relstream.scheduler.stock_v1 import V1Priority

COST = CostModel(Linear(0.001, 0.02), Linear(0.002, 0.02))


def full_of_backfill(live_rows: int) -> tuple[ScriptedView, Relstream]:
    """4 seats, all held by a backfill relQuery's 4 decoding rows (class -1); a live
    relQuery (class 0) of `live_rows` rows waits."""
    view = ScriptedView(EngineLimits(4, 1000, 100_000, 16))
    for request_id in view.add_relquery("backfill", [20] * 4, max_tokens=50, priority=-1):
        view.start(request_id)
    view.clock = 1.0
    view.add_relquery("live", [20] * live_rows, max_tokens=5, arrival=1.0)
    return view, Relstream(COST)


def test_a_waiting_higher_class_takes_the_seats_of_the_lowest_ranked_lower_rows():
    view, policy = full_of_backfill(live_rows=2)
    plan = policy.plan(view)
    # Two seats for the live relQuery's two rows: the backfill's last two rows go; vLLM
    # admits nothing in a step that preempts, so the live rows come in the next step.
    # The backfill's 4 decodes (8 ms) exceed 0.2 of a step's base (4 ms): this step,
    # which only seats the live relQuery, decodes none of them and stays short.
    assert plan.preempt == ("backfill#3", "backfill#2")
    assert not plan.prefill and not plan.decode
    for request_id in plan.preempt:
        view.tracker.requeue(request_id)
    plan = policy.plan(view)
    assert [chunk.request_id for chunk in plan.prefill] == ["live#0", "live#1"]
    assert not plan.preempt


def test_a_step_preempts_at_most_make_way_rows():
    view, policy = full_of_backfill(live_rows=MAKE_WAY_ROWS + 5)
    view.limits = EngineLimits(4, 1000, 100_000, 16)
    plan = policy.plan(view)
    assert len(plan.preempt) == 4  # every backfill row, as 4 < MAKE_WAY_ROWS seats are asked


def test_the_same_class_never_preempts():
    view = ScriptedView(EngineLimits(4, 1000, 100_000, 16))
    for request_id in view.add_relquery("big", [20] * 4, max_tokens=50):
        view.start(request_id)
    view.clock = 1.0
    view.add_relquery("small", [20], max_tokens=5, arrival=1.0)
    plan = Relstream(COST).plan(view)
    assert not plan.preempt and not plan.prefill  # it waits for a seat, as before


def test_a_starving_lower_class_still_goes_after_every_higher_one():
    view = ScriptedView(EngineLimits(8, 1000, 100_000, 16))
    view.add_relquery("old-backfill", [20], max_tokens=5, priority=-1)
    view.clock = 1000.0
    view.add_relquery("live", [20] * 3, max_tokens=50, arrival=1000.0)
    policy = Relstream(COST)
    policy.starvation.watch("old-backfill", 1.0)  # long past its deadline
    plan = policy.plan(view)
    order = [chunk.request_id for chunk in plan.prefill]
    assert order[:3] == ["live#0", "live#1", "live#2"] and order[3] == "old-backfill#0"


def test_vllms_priority_queue_takes_every_higher_class_first():
    # vLLM orders by one integer, smaller first: a class spans 2**40 of it.
    assert vllm_priority(1, 10**9) < vllm_priority(0, 0) < vllm_priority(-1, 0)
    view = ScriptedView(EngineLimits(8, 1000, 100_000, 16))
    view.add_relquery("small-backfill", [5], max_tokens=1, priority=-1)
    view.add_relquery("big-live", [500] * 4, max_tokens=100)
    order = [seq.request_id for seq in V1Priority(COST).waiting_order(view)]
    assert order == ["big-live#0", "big-live#1", "big-live#2", "big-live#3", "small-backfill#0"]


def test_lower_classes_decode_beside_a_higher_one_within_its_slowdown():
    # b = 20 ms, 2 ms a decode, 1 ms a prompt token. The live relQuery's 4 decodes: a
    # 28 ms step, so lower classes may add 0.2 × 28 = 5.6 ms: the first backfill's 2
    # rows (4 ms) decode, the second's 1 row (2 ms > 1.6 ms left) waits; 1.6 ms is one
    # prompt token for a waiting backfill.
    view = ScriptedView(EngineLimits(16, 1000, 100_000, 16))
    for relquery_id, rows, priority in (("live", 4, 0), ("bf-a", 2, -1), ("bf-b", 1, -1)):
        for request_id in view.add_relquery(relquery_id, [20] * rows, 50, priority=priority):
            view.start(request_id)
    view.add_relquery("bf-waiting", [20], max_tokens=5, priority=-1)
    active = [view.tracker.relqueries[rid] for rid in ("live", "bf-a", "bf-b")]
    c = Coefficients(base=0.02, per_token=0.001, per_decode=0.002, batch=7)
    slowdown = within_slowdown(active, c, budget=1000, waiting=None)
    assert slowdown.decoding == 2 and slowdown.allowance == pytest.approx(0.0016)
    waiting = view.tracker.relqueries["bf-waiting"]
    assert slowdown.prompt_limit(waiting, c.per_token) == 1
    assert slowdown.prompt_limit(active[0], c.per_token) is None  # the top class: any
    # The policy's own step, at the same prices: it ranks bf-b (less work) before bf-a,
    # so bf-b's row decodes (2 ms) and bf-a's two (4 ms more) wait.
    plan = Relstream(COST).plan(view)
    assert plan.decode == ("live#0", "live#1", "live#2", "live#3", "bf-b#0")


def test_a_waiting_class_whose_reserve_does_not_fit_never_stalls_the_engine():
    # 64 tokens of KV free; the live row takes 2 blocks now and keeps 480 more for its
    # 500-token budget (the reserve's whole share): the backfill's rows are preempted
    # for it, as admission counts its need. A step that preempted on a need counted
    # without the reserve planned nothing at all, every step (review).
    view = ScriptedView(EngineLimits(16, 1000, 100_000, 16))
    for request_id in view.add_relquery("backfill", [20] * 4, max_tokens=50, priority=-1):
        view.start(request_id)
    view.free_tokens = 64
    view.clock = 1.0
    view.add_relquery("live", [20], max_tokens=500, arrival=1.0)
    plan = Relstream(COST).plan(view)
    assert plan.preempt == ("backfill#3", "backfill#2", "backfill#1", "backfill#0")


def test_kv_short_for_the_top_class_takes_a_held_lower_row_first():
    # A (class 1) decodes 2 rows whose next tokens each need a new block; C (class 0,
    # 8 rows) is held by the slowdown; no KV is free: C's last row goes, not A's.
    view = ScriptedView(EngineLimits(16, 1000, 100_000, 16))
    for request_id in view.add_relquery("A", [16, 16], max_tokens=50, priority=1):
        view.start(request_id)
        view.tracker.running[request_id].computed_tokens = 16  # the next token: a block
    for request_id in view.add_relquery("C", [20] * 8, max_tokens=50):
        view.start(request_id)
    view.free_tokens = 16
    plan = Relstream(COST).plan(view)
    assert "A#0" in plan.decode and "A#1" in plan.decode
    assert all(request_id.startswith("C#") for request_id in plan.preempt)


def test_a_background_step_is_cut_to_its_bound_at_the_fitted_prices():
    # b = 20 ms, 2 ms a decode, 1 ms a prompt token; every class present is below 0.
    # 10 decodes: 0.45 − 0.02 − 0.02 = 0.41 s of prompt, 410 tokens, so a budget of 420.
    # 250 decodes already cost 0.52 s: prompts still get BACKGROUND_MIN_TOKENS.
    c = Coefficients(base=0.02, per_token=0.001, per_decode=0.002, batch=10)
    for rows, budget in ((10, 420), (250, 250 + BACKGROUND_MIN_TOKENS)):
        view = ScriptedView(EngineLimits(512, 2048, 1_000_000, 16))
        for request_id in view.add_relquery("backfill", [20] * rows, 50, priority=-1):
            view.start(request_id)
        active = [view.tracker.relqueries["backfill"]]
        assert within_slowdown(active, c, 2048, waiting=None).budget == budget
    view.add_relquery("live", [20], max_tokens=5)  # a class-0 relQuery present: no cut
    live = view.tracker.relqueries["live"]
    assert within_slowdown(active, c, 2048, waiting=live).budget is None
    assert BACKGROUND_STEP_S == 0.45


@pytest.mark.parametrize(("priority", "chunk"), [(-1, 430), (0, 1000)])
def test_a_background_prompt_is_chunked_to_a_short_step(priority, chunk):
    # Nothing runs; one 1,000-token row waits. At the prior's prices (b = 20 ms, 1 ms a
    # token) a background step takes (0.45 − 0.02) / 0.001 = 430 tokens of it; class 0
    # takes the whole budget.
    view = ScriptedView(EngineLimits(16, 1000, 100_000, 16))
    view.add_relquery("q", [1000], max_tokens=5, priority=priority)
    plan = Relstream(COST).plan(view)
    assert [(c.request_id, c.num_tokens) for c in plan.prefill] == [("q#0", chunk)]


def test_the_load_an_engine_reports_says_its_work_by_class():
    view, policy = full_of_backfill(live_rows=2)
    policy.plan(view)
    load = policy.load(view)
    assert [level for level, _ in load.class_work] == [0, -1]  # highest first
    assert sum(work for _, work in load.class_work) == pytest.approx(load.outstanding_s)
    assert load.ahead_of(0) < load.ahead_of(-1) == pytest.approx(load.outstanding_s)


def test_among_background_classes_the_lower_one_decodes_within_the_slowdown():
    # Classes -1 (4 decoding rows) and -2 (8): the slowdown acts as between any classes,
    # b = 20 ms, 2 ms a decode: -1's step 28 ms, so -2 may add 5.6 ms, less than its 16.
    # The cut budget counts the decodes that run: 4, plus (0.45 − 0.02 − 0.008) / 0.001.
    view = ScriptedView(EngineLimits(64, 2048, 1_000_000, 16))
    for relquery_id, rows, priority in (("bf-1", 4, -1), ("bf-2", 8, -2)):
        for request_id in view.add_relquery(relquery_id, [20] * rows, 50, priority=priority):
            view.start(request_id)
    active = [view.tracker.relqueries[rid] for rid in ("bf-1", "bf-2")]
    c = Coefficients(base=0.02, per_token=0.001, per_decode=0.002, batch=12)
    slowdown = within_slowdown(active, c, 2048, waiting=None)
    assert slowdown.decoding == 1 and slowdown.budget == 4 + 422


def test_dropping_a_twin_keeps_the_plans_cut_budget():
    view = ScriptedView(EngineLimits(16, 2048, 100_000, 16))
    view.add_relquery("a", [20], 5, shares={0: "k"}, priority=-1)
    view.add_relquery("b", [20], 5, shares={0: "k"}, priority=-1)
    plan = StepPlan(prefill=(PrefillChunk("a#0", 20), PrefillChunk("b#0", 20)), budget=300)
    assert view.tracker.unshared(plan) == StepPlan(prefill=(PrefillChunk("a#0", 20),), budget=300)
