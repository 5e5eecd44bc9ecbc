import pytest
from helpers import ScriptedView

from relstream.scheduler.data import SeqInfo
from relstream_lab.baselines.dpu import DPUConfig, DynamicPriorityUpdater


def make_dpu(cost, **config):
    return DynamicPriorityUpdater(cost, DPUConfig(**config))


def test_cache_miss_ratio_over_the_sample(cost, roomy_limits):
    view = ScriptedView(roomy_limits)
    view.add_relquery("A", [100, 100, 200], max_tokens=4)
    view.cached.update({"A#0": 50, "A#2": 100})
    dpu = make_dpu(cost)
    # (400 − 150) / 400
    assert dpu.cache_miss_ratio(view, view.tracker.relqueries["A"]) == pytest.approx(0.625)


def test_priority_is_pem_of_estimated_uncached_tokens(cost, roomy_limits):
    view = ScriptedView(roomy_limits)
    view.add_relquery("A", [100, 100, 200], max_tokens=4)
    view.cached.update({"A#0": 50, "A#2": 100})
    dpu = make_dpu(cost)
    dpu.update(view)
    # utok* = tok × 0.625 = 62.5, 62.5, 125 → one prefill batch of 250 tokens: 3.0;
    # one decode group of 3 requests, 4 times: 4 × (0.1·3 + 1) = 5.2
    assert dpu.priority["A"] == pytest.approx(8.2)


def test_fully_waiting_relquery_reuses_its_priority(cost, roomy_limits):
    view = ScriptedView(roomy_limits)
    view.add_relquery("W", [100, 100], max_tokens=4)
    view.add_relquery("R", [100, 100], max_tokens=4)
    dpu = make_dpu(cost)
    dpu.update(view)
    before_w, before_r = dpu.priority["W"], dpu.priority["R"]
    view.start("R#0")
    view.cached.update({"W#0": 96, "W#1": 96, "R#1": 96})  # the cache changed for both
    dpu.update(view)
    assert dpu.priority["W"] == before_w  # still fully waiting: reused, not re-probed
    assert dpu.priority["R"] < before_r  # running: recomputed (progress and cache)
    assert dpu.recomputed_last_update == 1


def test_new_requests_of_a_waiting_relquery_are_not_reused(cost, roomy_limits):
    view = ScriptedView(roomy_limits)
    view.add_relquery("W", [100], max_tokens=4)
    dpu = make_dpu(cost)
    dpu.update(view)
    before = dpu.priority["W"]
    view.tracker.add_request(SeqInfo("W#1", "W", 100, 4, 0.0), 2)
    dpu.update(view)
    assert dpu.priority["W"] > before


def test_half_finished_relquery_gets_a_lower_priority(cost, roomy_limits):
    view = ScriptedView(roomy_limits)
    ids = view.add_relquery("A", [100] * 4, max_tokens=2)
    dpu = make_dpu(cost)
    dpu.update(view)
    # 4 × 100 tokens: prefill 0.01·400 + 0.5 = 4.5; decode 2 × (0.1·4 + 1) = 2.8
    assert dpu.priority["A"] == pytest.approx(7.3)
    view.start(ids[0])
    view.start(ids[1])
    dpu.update(view)
    # prefilled requests leave the decomposition: prefill 2.5, decode 2 × 1.2 = 2.4
    assert dpu.priority["A"] == pytest.approx(4.9)


def test_starvation_guard_sets_priority_zero(cost, roomy_limits):
    view = ScriptedView(roomy_limits)
    view.add_relquery("big", [100] * 2, max_tokens=50, arrival=0.0)
    view.add_relquery("small", [10], max_tokens=1, arrival=0.0)
    dpu = make_dpu(cost, starvation_threshold=1.0)  # 1 s per request of R_0
    view.clock = 1.9
    dpu.update(view)
    assert dpu.head(view).relquery_id == "small"
    view.clock = 2.0  # waiting_time / req(R_0) = 2.0 / 2 reaches the threshold
    dpu.update(view)
    assert dpu.priority["big"] == 0.0
    assert dpu.head(view).relquery_id == "big"


def test_head_orders_by_priority_then_arrival(cost, roomy_limits):
    view = ScriptedView(roomy_limits)
    view.add_relquery("late", [100], max_tokens=4, arrival=1.0)
    view.add_relquery("early", [100], max_tokens=4, arrival=0.0)
    view.add_relquery("huge", [100] * 10, max_tokens=4, arrival=0.0)
    dpu = make_dpu(cost)
    view.clock = 1.0
    dpu.update(view)
    assert dpu.head(view).relquery_id == "early"
