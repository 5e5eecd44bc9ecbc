"""The multi-engine simulator behind placement: one engine behind it is the simulator
itself, every relQuery is answered once whatever the placement, and the pooled ideal
hands its queue's head to the first free engine with the least work."""

from dataclasses import replace

import pytest

from relstream.scheduler.relstream_policy import Relstream
from relstream.sim.profiles import get_profile
from relstream.sim.simulator import Simulator
from relstream_lab.common.runner import make_cost_model
from relstream_lab.common.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream_lab.placement.run import PLACEMENTS, pooled_choice, serve_placed, serve_pooled

PROFILE = get_profile("a100-opt13b")


def trace(count: int):
    config = TraceConfig(num_relqueries=count, max_rows=12, seed=3)
    tokenized = tokenize_trace(generate_relqueries(config, load_datasets(None)), config)
    return tokenized.at_rate(20.0, PROFILE.limits.block_size)


def test_one_engine_behind_placement_is_the_simulator_itself():
    alone = Simulator(PROFILE, Relstream(make_cost_model("online", PROFILE))).run(trace(30))
    outcomes, makespan = serve_placed(PROFILE, trace(30), engines=1, placement="load")
    assert makespan == pytest.approx(alone.makespan)
    by_id = {o.relquery_id: o.latency.total for o in alone.outcomes}
    assert {o.relquery_id: o.latency.total for o in outcomes} == pytest.approx(by_id)


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_every_relquery_is_answered_once_on_three_engines(placement):
    relqueries = trace(40)
    outcomes, _ = serve_placed(PROFILE, relqueries, engines=3, placement=placement)
    assert sorted(o.relquery_id for o in outcomes) == sorted(r.relquery_id for r in relqueries)


def test_pooled_head_goes_to_the_first_free_engine_with_least_work():
    # (clock, can start, outstanding): engine 2's queue is full, engine 0 is free first
    engines = [(1.0, True, 5.0), (2.0, True, 0.0), (0.5, False, 0.0)]
    assert pooled_choice(engines, arrived=0.0) == (1.0, 0)
    # arriving at 3.0 both free engines can start it: the lighter one takes it
    assert pooled_choice(engines, arrived=3.0) == (3.0, 1)
    # equal work: the lower index
    assert pooled_choice([(0.0, True, 1.0), (0.0, True, 1.0)], arrived=0.5) == (0.5, 0)
    assert pooled_choice([(0.0, False, 0.0)], arrived=0.0) is None


def test_pooled_one_engine_with_room_is_the_simulator_itself():
    relqueries = trace(20)
    spaced = [replace(rq, arrival_time=index * 60.0) for index, rq in enumerate(relqueries)]
    alone = Simulator(PROFILE, Relstream(make_cost_model("online", PROFILE))).run(spaced)
    outcomes, makespan = serve_pooled(PROFILE, spaced, engines=1)
    assert makespan == pytest.approx(alone.makespan)
    by_id = {o.relquery_id: o.latency.total for o in alone.outcomes}
    assert {o.relquery_id: o.latency.total for o in outcomes} == pytest.approx(by_id)


def test_the_smallest_first_pool_hands_out_its_smallest_relquery_first():
    # Everything arrives at once on one engine: the FCFS pool hands it out in arrival
    # order, the smallest-first pool by work, so its relQueries wait less in all.
    relqueries = [replace(rq, arrival_time=0.0) for rq in trace(12)]
    fcfs, _ = serve_pooled(PROFILE, relqueries, engines=1)
    smallest, _ = serve_pooled(PROFILE, relqueries, engines=1, smallest=True)
    size = {rq.relquery_id: sum(r.prompt_tokens for r in rq.requests) + rq.max_tokens
            * len(rq.requests) for rq in relqueries}  # fmt: skip
    # The smallest relQuery waits less in the smallest-first pool than the largest does.
    by_id = {o.relquery_id: o.latency.total for o in smallest}
    assert by_id[min(size, key=size.get)] < by_id[max(size, key=size.get)]
    assert sum(by_id.values()) < sum(o.latency.total for o in fcfs)
