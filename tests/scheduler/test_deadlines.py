"""Deadlines users set, on cases computed by hand: a relQuery that can no longer meet its
deadline goes behind the others, so a relQuery that still can overtakes it in size
order; the clock alone moves it there; without deadlines nothing changes."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, Linear
from relstream.scheduler.data import EngineLimits
from relstream.scheduler.deadlines import DeadlineWatch, lost_at
from relstream.scheduler.lengths import WINDOW, OutputLengths
from relstream.scheduler.relstream_policy import RelstreamConfig
from relstream.sim.kvcache import block_hashes
from relstream.sim.profiles import get_profile
from relstream.sim.simulator import SimRelQuery, SimRequest, Simulator
from relstream_lab.common.runner import make_cost_model
from relstream_lab.policies import (
    RelstreamUngated,  # V1's batches: the order alone under test
    make_sim_policy,
)

# b = 25 ms, a_p = 1 ms, a_d = 2.5 ms; 64 seats, a budget of 512 tokens.
SMALL_COST = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))


def two_relqueries(small_deadline: float | None, big_deadline: float | None = None) -> ScriptedView:
    """big (20 rows of 50 prompt tokens, 20 output tokens) and small (2 such rows,
    arriving 0.1 s later), with their deadlines."""
    view = ScriptedView(EngineLimits(64, 512, 100_000, 16))
    view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0, deadline=big_deadline)
    view.add_relquery("small", [50] * 2, max_tokens=20, arrival=0.1, deadline=small_deadline)
    return view


def first_rows(plan) -> list[str]:
    return [chunk.request_id for chunk in plan.prefill]


SIZE_ORDER = ["small#0", "small#1", *(f"big#{row}" for row in range(9))]
BIG_FIRST = [f"big#{row}" for row in range(11)]


def test_a_relquery_is_lost_once_less_than_what_it_needs_is_left():
    assert lost_at(10.0, 4.0) == pytest.approx(6.0)  # 10 − 4


def test_a_deadline_overtakes_size_order_once_the_smaller_relquery_cannot_meet_its_own():
    # Nothing running (n = 1), nothing observed: a step is taken to last b + a_d = 27.5 ms.
    # small needs τ = 1 ms × 100 prompt tokens + 20 steps × 27.5 ms = 0.65 s and is
    # smaller (W = 1.2 s against big's 12 s, test_relstream): size order puts it first
    # (its 2 rows, then 8 whole prompts of big and 12 tokens of the ninth). It is lost
    # once less than τ = 0.65 s is left: with a deadline 0.6 s away big, whose own
    # deadline (τ = 1 s + 0.55 s, 10 s away) is within reach, goes first and takes the
    # whole budget: 10 prompts of 50 and 12 tokens of the eleventh.
    for deadline, first in ((None, SIZE_ORDER), (0.7, SIZE_ORDER), (0.6, BIG_FIRST)):
        plan = RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(two_relqueries(deadline, 10.0))
        assert first_rows(plan) == first
    assert [chunk.num_tokens for chunk in plan.prefill][-1] == 12


def test_finished_rows_of_the_same_budget_say_how_long_a_relquery_still_needs():
    # Eight rows with small's budget (20 tokens) finished after 2 tokens each: the longer
    # of small's 2 rows is expected at 2 tokens, so τ = 0.1 s + 2 × 27.5 ms = 0.155 s: a
    # deadline 0.4 s away, which lost it above on its whole budget (τ = 0.65 s), is now
    # within reach: size order stands.
    view = two_relqueries(0.4, 10.0)
    for _ in range(8):
        view.tracker.outputs.add(20, 2)
    assert first_rows(RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(view)) == SIZE_ORDER


def test_the_longest_of_m_rows_is_read_at_the_m_over_m_plus_1_quantile():
    lengths = OutputLengths()
    for generated in range(1, 8):
        lengths.add(100, generated)
    assert lengths.longest(100, 1) is None  # 7 rows: not trusted yet
    lengths.add(100, 8)
    # 8 rows of 1..8 tokens: one row at rank 8·1//2 = 4 (5 tokens), three at 8·3//4 = 6
    # (7 tokens), a hundred at the largest (8); another budget knows nothing.
    assert [lengths.longest(100, rows) for rows in (1, 3, 100)] == [5, 7, 8]
    assert lengths.longest(50, 1) is None
    for _ in range(WINDOW):
        lengths.add(100, 300)  # past the budget (a resumed row): capped at it
    assert lengths.longest(100, 1) == 100  # 1..8 have left the window


def test_the_clock_alone_moves_a_waiting_relquery_behind_once_it_is_lost():
    # small due at 1 s: lost from 1 − 0.65 = 0.35 s. Nothing changes in the engine
    # between the plans; a watch set when small was ranked re-ranks it.
    policy = RelstreamUngated(SMALL_COST, RelstreamConfig())
    view = two_relqueries(1.0)
    for clock, first in ((0.0, SIZE_ORDER), (0.3, SIZE_ORDER), (0.4, BIG_FIRST)):
        view.clock = clock
        assert first_rows(policy.plan(view)) == first


def test_the_reference_without_deadlines_ignores_them():
    config = RelstreamConfig(deadlines=False)
    assert first_rows(RelstreamUngated(SMALL_COST, config).plan(two_relqueries(0.4))) == SIZE_ORDER


def test_the_watch_keeps_the_earliest_look_and_skips_finished_relqueries():
    watch = DeadlineWatch()
    watch.watch("a", 5.0)
    watch.watch("a", 7.0)  # later: the 5 s look stands
    watch.watch("b", 3.0)
    watch.watch("c", None)
    assert watch.due(4.0, {"a", "b"}) == {"b"}
    assert watch.due(6.0, {"b"}) == set()  # a finished meanwhile


def test_the_simulator_says_whether_each_deadline_was_met():
    # Two relQueries of 4 rows arriving at once: "easy" due in an hour, "tight" due 1 ms
    # after it arrives (no step is that short), "free" without a deadline.
    profile = get_profile("a100-opt13b")
    relqueries = []
    for name, deadline in (("easy", 3600.0), ("tight", 0.001), ("free", None)):
        requests = [
            SimRequest(f"{name}#{row}", 64, block_hashes([row + 1] * 64, 16), 8) for row in range(4)
        ]
        relqueries.append(SimRelQuery(name, 0.0, 8, requests, deadline=deadline))
    for policy in ("relstream", "relstream-no-deadlines", "v1-fcfs"):
        built = make_sim_policy(policy, make_cost_model("online", profile))
        run = Simulator(profile, built).run(relqueries)
        met = {outcome.relquery_id: outcome.deadline_met for outcome in run.outcomes}
        assert met == {"easy": True, "tight": False, "free": None}
