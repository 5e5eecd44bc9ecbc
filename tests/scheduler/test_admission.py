"""One admission for every policy: why it stops (seats, budget, KV, a preemption), how
V0 and V1 treat a prompt longer than the budget, and that relstream's order never takes
less work into a step than stock V1 when a backlog waits. Every case is computed by hand."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, Linear, make_policy
from relstream.scheduler.admission import Chunking, StepAdmission, Stop
from relstream.scheduler.data import EngineLimits
from relstream.scheduler.relstream_policy import Relstream, RelstreamConfig
from relstream.scheduler.tracker import prefill_cap
from relstream_lab.policies import RelstreamUngated


def engine(
    seats: int = 8, budget: int = 100, block: int = 16, threshold: int = 0, adaptive: bool = False
) -> ScriptedView:
    return ScriptedView(
        EngineLimits(
            max_num_seqs=seats,
            max_num_batched_tokens=budget,
            kv_capacity_tokens=10_000,
            block_size=block,
            long_prefill_token_threshold=threshold,
            long_prefill_adaptive=adaptive,
        )
    )


def waiting(view: ScriptedView):
    return list(view.tracker.waiting.values())


def admitted(step: StepAdmission) -> list[tuple[str, int]]:
    return [(chunk.request_id, chunk.num_tokens) for chunk in step.admitted]


def test_v1_cuts_the_prompt_that_overflows_the_budget():
    view = engine(budget=100)
    view.add_relquery("a", [60, 60, 60], max_tokens=4)
    step = StepAdmission.for_step(view)
    assert step.admit(waiting(view)) is Stop.BUDGET
    assert admitted(step) == [("a#0", 60), ("a#1", 40)]


def test_v0_takes_whole_prompts_and_a_long_one_alone():
    view = engine(budget=100)
    view.add_relquery("a", [60, 60], max_tokens=4)
    step = StepAdmission.for_step(view, Chunking.WHOLE)
    assert step.admit(waiting(view)) is Stop.BUDGET
    assert admitted(step) == [("a#0", 60)]
    alone = engine(budget=100)
    alone.add_relquery("b", [150], max_tokens=4)
    step = StepAdmission.for_step(alone, Chunking.WHOLE)
    assert step.admit(waiting(alone)) is Stop.DRAINED
    assert admitted(step) == [("b#0", 150)]


def long_prompts(count: int, threshold: int = 400, adaptive: bool = False) -> ScriptedView:
    """`count` relQueries of one 800-token prompt each; budget 1,024 (vLLM's test)."""
    view = engine(budget=1024, threshold=threshold, adaptive=adaptive)
    for n in range(count):
        view.add_relquery(f"q{n}", [800], max_tokens=4, arrival=float(n))
    return view


def chunks(plan) -> list[tuple[str, int]]:
    return [(chunk.request_id, chunk.num_tokens) for chunk in plan.prefill]


def test_v1_cuts_each_prompt_at_the_long_prefill_threshold_unless_it_is_alone():
    # Threshold 400, budget 1,024: 400 + 400 + the 224 left (vLLM's own test case).
    view = long_prompts(3)
    step = StepAdmission.for_step(view)
    assert step.admit(waiting(view)) is Stop.DRAINED
    assert admitted(step) == [("q0#0", 400), ("q1#0", 400), ("q2#0", 224)]
    # A lone request starves nobody: vLLM lets it take the budget.
    alone = long_prompts(1)
    step = StepAdmission.for_step(alone)
    assert step.admit(waiting(alone)) is Stop.DRAINED
    assert admitted(step) == [("q0#0", 800)]


def test_a_running_prompt_continues_in_chunks_of_the_threshold():
    # q0 started with no token computed yet: 400 of its 800, then q1's 400.
    view = long_prompts(2)
    view.tracker.start("q0#0")
    step = StepAdmission.for_step(view)
    step.run_running(list(view.tracker.running.values()))
    step.admit(waiting(view))
    assert chunks(step.plan()) == [("q0#0", 400), ("q1#0", 400)]


def test_the_adaptive_threshold_is_never_below_a_fair_share_of_the_budget():
    # max(100, 1,024 // 3 requests) = 341; no threshold, no cap.
    view = long_prompts(3, threshold=100, adaptive=True)
    assert prefill_cap(view.limits, view.tracker) == 341
    assert prefill_cap(long_prompts(3, threshold=100).limits, view.tracker) == 100
    assert prefill_cap(long_prompts(3, threshold=0).limits, view.tracker) is None


@pytest.mark.parametrize("policy", [Relstream, RelstreamUngated])
def test_relstream_cuts_prompts_at_the_threshold_and_fills_the_budget(policy):
    # Before it read the threshold, relstream planned 800 + 224 and vLLM ran 400 + 400
    # of them, leaving the third request waiting with budget and seats to spare.
    plan = policy(COST, RelstreamConfig()).plan(long_prompts(3))
    assert sorted(size for _, size in chunks(plan)) == [224, 400, 400]


def test_a_gated_step_counts_a_chunk_at_the_threshold_as_whole():
    # Under a limit of 450 prompt tokens a prompt goes only whole, and vLLM runs 400 of
    # an 800-token prompt: that chunk is whole. q1 then finds 50 of the limit left.
    view = long_prompts(2)
    view.tracker.start("q0#0")
    step = StepAdmission.for_step(view, reserve=1.0)
    step.decode(list(view.tracker.active_relqueries.values()))
    step.continue_prompts(view.tracker.relqueries["q0"], limit=450)
    assert step.admit(view.tracker.relqueries["q1"].waiting.values(), limit=50) is Stop.LIMIT
    assert chunks(step.plan()) == [("q0#0", 400)]


def test_sarathi_continues_and_admits_prompts_in_chunks_of_the_threshold():
    # Its own budget of 512: q0's running prompt 400, then 112 of q1's.
    from relstream_lab.baselines.v0 import Sarathi

    view = long_prompts(2)
    view.tracker.start("q0#0")
    assert chunks(Sarathi(COST).plan_step(view)) == [("q0#0", 400), ("q1#0", 112)]


def test_seats_end_admission():
    view = engine(seats=2)
    view.add_relquery("a", [10, 10, 10], max_tokens=4)
    step = StepAdmission.for_step(view)
    assert step.admit(waiting(view)) is Stop.SEATS
    assert admitted(step) == [("a#0", 10), ("a#1", 10)]


def test_kv_ends_admission_and_a_cached_prefix_needs_fewer_blocks():
    # 48 free KV tokens = 3 blocks of 16. A 20-token prompt needs 2 blocks; the second
    # finds 1 free and stops admission, unless 16 of its tokens are cached (1 block).
    view = engine()
    view.add_relquery("a", [20, 20], max_tokens=4)
    view.free_tokens = 48
    step = StepAdmission.for_step(view)
    assert step.admit(waiting(view)) is Stop.KV
    assert admitted(step) == [("a#0", 20)]
    view.cached["a#1"] = 16
    step = StepAdmission.for_step(view)
    assert step.admit(waiting(view)) is Stop.DRAINED
    assert admitted(step) == [("a#0", 20), ("a#1", 4)]


def test_a_step_that_preempted_admits_nobody():
    # Two running rows of 16 computed tokens each need a second block; one is free, so
    # the second row (the victim, ranked last) is evicted and nobody is admitted.
    view = engine()
    view.add_relquery("a", [16, 16], max_tokens=4)
    view.start("a#0")
    view.start("a#1")
    view.add_relquery("b", [10], max_tokens=4)
    view.free_tokens = 16
    step = StepAdmission.for_step(view)
    step.run_running(list(view.tracker.running.values()))
    assert [seq.request_id for seq in step.preempted] == ["a#1"]
    assert step.admit(waiting(view)) is Stop.PREEMPTED
    assert step.plan().decode == ("a#0",) and step.plan().prefill == ()


# b = 25 ms, a_p = 1 ms, a_d = 2.5 ms
COST = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))


def requests_and_tokens(view: ScriptedView, policy: str) -> tuple[int, int]:
    plan = make_policy(policy, COST).plan(view)
    return len(plan.prefill) + len(plan.decode), sum(c.num_tokens for c in plan.prefill)


def test_relstream_takes_at_least_as_many_requests_as_v1_under_a_backlog():
    # Budget 200. "a" (4 rows of 100 tokens, 20 output each) arrived first; "b" (4 rows
    # of 20 tokens) ranks first in relstream. V1 FCFS: a#0, a#1 = 2 requests, 200 tokens.
    # relstream: b's 80 tokens, a#0's 100, 20 of a#1 = 6 requests, 200 tokens.
    view = engine(budget=200)
    view.add_relquery("a", [100] * 4, max_tokens=20, arrival=0.0)
    view.add_relquery("b", [20] * 4, max_tokens=20, arrival=1.0)
    assert requests_and_tokens(view, "v1-fcfs") == (2, 200)
    assert requests_and_tokens(view, "relstream") == (6, 200)
    # Seats bound (3 seats, budget 1,000): both take 3.
    seated = engine(seats=3, budget=1000)
    seated.add_relquery("a", [100] * 4, max_tokens=20, arrival=0.0)
    seated.add_relquery("b", [20] * 4, max_tokens=20, arrival=1.0)
    assert requests_and_tokens(seated, "v1-fcfs")[0] == 3
    assert requests_and_tokens(seated, "relstream")[0] == 3


def test_where_relstream_takes_fewer_requests_it_takes_as_many_tokens():
    # The one case where relstream's order admits fewer requests than V1's: the relQuery
    # it ranks first has long prompts. "many" (10 rows of 20 tokens, 100 output each:
    # W = 1 ms × 200 + (2.5 ms + 25 ms / 1 running) × 1,000 = 27.7 s) arrived first;
    # "long" (one 400-token prompt, 1 output: W = 0.4 + 0.0275 s) ranks first. V1 takes
    # 10 short prompts; relstream 200 tokens of the long one. The step computes the same
    # 200 tokens either way: the throughput is the same.
    view = engine(seats=16, budget=200)
    view.add_relquery("many", [20] * 10, max_tokens=100, arrival=0.0)
    view.add_relquery("long", [400], max_tokens=1, arrival=1.0)
    assert requests_and_tokens(view, "v1-fcfs") == (10, 200)
    assert requests_and_tokens(view, "relstream") == (1, 200)
