"""Fair share between queries (`scheduler.fairshare`, VTC): counters, the lift, the
order, on cases computed by hand."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, Linear
from relstream.scheduler.data import EngineLimits, PrefillChunk, StepPlan
from relstream.scheduler.fairshare import FairQueue, FairShare
from relstream.scheduler.relstream_policy import Relstream, RelstreamConfig

COST = CostModel(Linear(0.001, 0.02), Linear(0.002, 0.02))


def test_a_step_charges_its_tokens_over_the_querys_weight():
    view = ScriptedView(EngineLimits(8, 1000, 100_000, 16))
    view.add_relquery("a1", [30], 5, query="a")
    for request_id in view.add_relquery("b1", [20, 20], 5, query="b"):
        view.start(request_id)
    share = FairShare({"b": 2.0})
    plan = StepPlan(prefill=(PrefillChunk("a1#0", 30),), decode=("b1#0", "b1#1"))
    share.charge(plan, view.tracker)
    assert share.counters == {"a": 30.0, "b": 1.0}  # b: 2 decodes over weight 2


def test_a_query_that_waits_anew_is_lifted_to_the_least_counter_of_those_waiting():
    share = FairShare()
    share.backlogged(["a", "b"])
    share.counters.update(a=100.0, b=40.0)
    share.backlogged(["a", "b", "c"])  # c comes: lifted to 40, not left at 0
    assert share.counters["c"] == 40.0
    share.counters["c"] = 10.0  # served little, then went idle
    share.backlogged(["a", "b"])  # c at or below the floor (40): forgotten
    assert "c" not in share.counters
    share.backlogged(["a", "b", "c"])
    assert share.counters["c"] == 40.0


def test_the_class_leads_then_the_query_served_least_then_the_rank():
    share = FairShare()
    share.counters.update(a=50.0, b=10.0)
    queue = FairQueue(share)
    queue.put("a-live", (0, 1, 5.0, "a-live"), "a")
    queue.put("b-live", (0, 1, 9.0, "b-live"), "b")
    queue.put("b-backfill", (1, 1, 0.0, "b-backfill"), "b")
    queue.put("b-live2", (0, 1, 7.0, "b-live2"), "b")
    assert [rank[-1] for rank in queue] == ["b-live2", "b-live", "a-live", "b-backfill"]
    queue.drop("b-live2")
    queue.drop("b-live")
    assert [rank[-1] for rank in queue] == ["a-live", "b-backfill"] and len(queue) == 2
    assert sorted(queue.queries()) == ["a", "b"]


@pytest.mark.parametrize(("weights", "second"), [(None, "a2#0"), ({}, "b1#0")])
def test_a_query_served_goes_after_one_that_was_not(weights, second):
    # One seat. a1 goes first (the same work, earliest). With fair share on, its 20
    # prompt tokens put query a's counter at 20, so b1 (counter 0) goes before a2,
    # which arrived before it; off, relstream's order takes a2.
    view = ScriptedView(EngineLimits(1, 1000, 100_000, 16))
    view.add_relquery("a1", [20], 5, query="a")
    view.add_relquery("a2", [20], 5, arrival=0.1, query="a")
    view.add_relquery("b1", [20], 5, arrival=0.2, query="b")
    view.clock = 1.0
    policy = Relstream(COST, RelstreamConfig(fair_weights=weights))
    assert [chunk.request_id for chunk in policy.plan(view).prefill] == ["a1#0"]
    view.start("a1#0")
    view.tracker.finish("a1#0", answered=True)
    assert [chunk.request_id for chunk in policy.plan(view).prefill] == [second]


def test_a_weight_must_be_positive():
    with pytest.raises(ValueError, match="'a'"):
        FairShare({"a": 0.0})


def test_with_nothing_waiting_before_idle_counters_are_forgotten():
    share = FairShare()
    share.backlogged(["a"])
    share.counters.update(a=30.0, gone=90.0)
    share.backlogged([])  # nothing waits: no query was short of service, all forgotten
    assert share.counters == {}
    share.backlogged(["b"])  # no floor to lift to: b starts at 0
    assert share.counters == {}


def test_twins_dropped_from_a_plan_are_not_charged():
    view = ScriptedView(EngineLimits(8, 1000, 100_000, 16))
    view.add_relquery("a1", [30], 5, shares={0: "k"}, query="a")
    view.add_relquery("b1", [30], 5, shares={0: "k"}, query="b")
    policy = Relstream(COST, RelstreamConfig(fair_weights={}))
    policy.plan(view)  # both planned; the mechanisms run one for both (`unshared`)
    assert policy.fair.counters == {"a": 30.0}
