"""Deadlines users set, on cases computed by hand: a relQuery at risk of missing its
deadline overtakes size order and passes the Δ gate; one that is not yet at risk, or can
no longer make it, keeps its size rank; without deadlines nothing changes."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, EngineLimits, Linear
from relstream.scheduler.deadlines import DeadlineWatch, Urgency, next_change, status
from relstream.scheduler.relstream import Relstream, RelstreamConfig

# b = 25 ms, a_p = 1 ms, a_d = 2.5 ms; 64 seats, a budget of 512 tokens.
SMALL_COST = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))
FULL_BATCHES = RelstreamConfig(gate="never")  # V1's batches: the order alone is under test


def two_relqueries(deadline: float | None) -> ScriptedView:
    """big (20 rows of 50 prompt tokens, 20 output tokens, the deadline) and small (2
    such rows, no deadline, arriving 0.1 s later)."""
    view = ScriptedView(EngineLimits(64, 512, 100_000, 16))
    view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0, deadline=deadline)
    view.add_relquery("small", [50] * 2, max_tokens=20, arrival=0.1)
    return view


def first_rows(plan) -> list[str]:
    return [chunk.request_id for chunk in plan.prefill]


SIZE_ORDER = ["small#0", "small#1", *(f"big#{row}" for row in range(9))]
BIG_FIRST = [f"big#{row}" for row in range(11)]


def test_status_is_at_risk_between_one_and_two_needed_times_before_the_deadline():
    # τ = 1 s: at risk while the deadline is 1 to 2 s away; unreachable under 1 s.
    assert status(None, 1.0, 0.0) is Urgency.OTHER
    assert status(2.5, 1.0, 0.0) is Urgency.OTHER
    assert status(1.5, 1.0, 0.0) is Urgency.AT_RISK
    assert status(0.5, 1.0, 0.0) is Urgency.OTHER
    assert next_change(2.5, 1.0, 0.0) == 0.5  # becomes at risk
    assert next_change(2.5, 1.0, 1.0) == 1.5  # becomes unreachable
    assert next_change(2.5, 1.0, 2.0) is None


@pytest.mark.parametrize(
    ("deadline", "first"),
    [(None, SIZE_ORDER), (3.2, SIZE_ORDER), (3.0, BIG_FIRST), (1.5, SIZE_ORDER)],
)
def test_a_deadline_at_risk_overtakes_size_order(deadline, first):
    # Nothing running (n = 1), nothing observed: a step is taken to last b + a_d = 27.5 ms.
    # big needs τ = 1 ms × 1,000 prompt tokens + 20 steps × 27.5 ms = 1.55 s; small is
    # smaller (W = 1.2 s against 12 s, test_relstream) and goes first in size order.
    # - deadline 3.2 s: slack 3.2 − 1.55 = 1.65 s > τ, not at risk yet: size order
    #   (small's 2 rows, then 8 whole prompts of big and 12 tokens of the ninth);
    # - 3.0 s: slack 1.45 s ≤ τ, at risk: big's rows take the whole 512-token budget
    #   (10 prompts of 50 and 12 tokens of the eleventh) ahead of small;
    # - 1.5 s: slack −0.05 s, unreachable: size order again.
    plan = Relstream(SMALL_COST, FULL_BATCHES).plan(two_relqueries(deadline))
    assert first_rows(plan) == first


def test_a_waiting_relquery_is_raised_when_its_deadline_nears_and_dropped_when_lost():
    # Deadline 4 s, τ = 1.55 s: at risk from 4 − 3.1 = 0.9 s, unreachable from 2.45 s.
    # Nothing changes in the engine between the plans: the clock alone re-ranks big.
    policy = Relstream(SMALL_COST, FULL_BATCHES)
    view = two_relqueries(4.0)
    for clock, first in ((0.0, SIZE_ORDER), (1.0, BIG_FIRST), (2.5, SIZE_ORDER)):
        view.clock = clock
        assert first_rows(policy.plan(view)) == first


def test_the_reference_without_deadlines_ignores_them():
    config = RelstreamConfig(gate="never", deadlines=False)
    assert first_rows(Relstream(SMALL_COST, config).plan(two_relqueries(3.0))) == SIZE_ORDER


def started_small(deadline: float | None) -> ScriptedView:
    view = two_relqueries(deadline)
    view.start("small#0")
    view.start("small#1")
    return view


def test_a_relquery_at_risk_passes_the_gate():
    # small's two rows decode (19 tokens left each: 38, in 19 steps; n = 2). The gate
    # holds big back: Δ+ = 1 ms × 1,000 + 2.5 ms × 20 rows × min(20, 19) = 1.95 s,
    # Δ- = (25 ms × 19 + 2.5 ms × 38) − 2.5 ms × min(38, 2 × 20) = 0.475 s, nobody behind:
    # Δ = 1.475 s ≥ 0.
    held = Relstream(SMALL_COST).plan(started_small(None))
    assert held.prefill == () and sorted(held.decode) == ["small#0", "small#1"]
    # With a deadline of 2 s, τ = 1 s of prompt + 20 steps × (25 + 2 × 2.5) ms = 1.6 s:
    # slack 0.4 s ≤ τ, at risk: big goes first and is admitted whatever Δ says, its rows
    # filling the 510 tokens the two decodes leave (10 prompts of 50, 10 tokens of one).
    urgent = Relstream(SMALL_COST).plan(started_small(2.0))
    assert first_rows(urgent) == [f"big#{row}" for row in range(11)]
    assert sum(chunk.num_tokens for chunk in urgent.prefill) == 510


def test_the_watch_keeps_the_earliest_look_and_skips_finished_relqueries():
    watch = DeadlineWatch()
    watch.watch("a", 5.0)
    watch.watch("a", 7.0)  # later: the 5 s look stands
    watch.watch("b", 3.0)
    watch.watch("c", None)
    assert watch.due(4.0, {"a", "b"}) == {"b"}
    assert watch.due(6.0, {"b"}) == set()  # a finished meanwhile
