"""Identical requests of different relQueries (twins) each ranked as their own relQuery:
the tracker runs the first to start and holds the others, a twin that stops without its
answer hands over, and held rows are no work of their relQuery. Hand-computed cases on
the pure scheduler, and the engine's bookkeeping of twins (relstream.engine.twins)."""

import asyncio

from helpers import ScriptedView

from relstream.engine.answers import SharedOutcome, request_key
from relstream.engine.twins import SharedRequests
from relstream.model import RelQuery, RelQueryResult, Row, RowResult, RowStatus, Template
from relstream.outputspec import Sampling
from relstream.scheduler import CostModel, Linear
from relstream.scheduler.data import EngineLimits, PrefillChunk, StepPlan
from relstream.scheduler.relstream_policy import RelstreamConfig
from relstream.scheduler.remaining import Remaining, expected_output, remaining
from relstream.service.metrics import EngineMetrics
from relstream.wire.convert import metrics_message
from relstream_lab.policies import RelstreamUngated  # V1's batches: the order alone under test

# b = 25 ms, a_p = 1 ms, a_d = 2.5 ms (as tests/scheduler/test_relstream.py).
SMALL_COST = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))


def engine(seats: int = 2) -> ScriptedView:
    limits = EngineLimits(
        max_num_seqs=seats, max_num_batched_tokens=512, kv_capacity_tokens=100_000, block_size=16
    )
    return ScriptedView(limits)


def big_and_small() -> ScriptedView:
    """BIG: 20 rows of 50 prompt tokens, budget 20, its last row shares key "k" with the
    one row of SMALL, which arrives 0.1 s later."""
    view = engine()
    view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0, shares={19: "k"})
    view.add_relquery("small", [50], max_tokens=20, arrival=0.1, shares={0: "k"})
    return view


def test_a_relquery_repeating_a_waiting_row_is_ranked_as_itself_and_runs_it_first():
    # Nothing running (n = 1): W(small) = 1 ms × 50 + 27.5 ms × 20 = 0.6 s, rank
    # 0.1 + 64 × 0.6 = 38.5; W(big) = 1 ms × 1,000 + 27.5 ms × 400 = 12 s, rank 768.
    # SMALL's row goes first although BIG asked for the same request before it.
    view = big_and_small()
    plan = RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(view)
    assert [chunk.request_id for chunk in plan.prefill] == ["small#0", "big#0"]
    # It starts: BIG's copy waits on it, out of the queue, and is no work of BIG's:
    # 19 rows × 50 prompt tokens and 19 × 20 output tokens are left, of 20 rows.
    view.start("small#0")
    tracker = view.tracker
    assert "big#19" in tracker.held and "big#19" not in tracker.waiting
    assert remaining(tracker.relqueries["big"]) == Remaining(20, 950, 380, 20)
    # SMALL's answer ends it; BIG's copy, answered, finishes without generating here:
    # it does not pull BIG's expected output (20, its budget: no row of BIG ran) down.
    tracker.finish("small#0", answered=True)
    assert "big#19" in tracker.held
    tracker.finish("big#19")
    big = tracker.relqueries["big"]
    assert (big.finished, big.twin_answered, expected_output(big)) == (1, 1, 20)
    assert remaining(big) == Remaining(19, 950, 380, 20)


def test_a_relquery_whose_rows_all_wait_on_twins_has_no_work_left():
    view = big_and_small()
    view.start("big#19")  # BIG's copy started first: SMALL's waits on it
    small = view.tracker.relqueries["small"]
    assert not small.waiting and not small.running and "small#0" in small.held
    assert remaining(small) == Remaining(1, 0, 0, 0)
    plan = RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(view)
    assert "small#0" not in {chunk.request_id for chunk in plan.prefill}


def test_a_twin_that_ends_without_its_answer_hands_over_to_the_held_ones():
    view = engine()
    for name in ("a", "b", "c"):
        view.add_relquery(name, [50], max_tokens=20, shares={0: "k"})
    tracker = view.tracker
    view.start("a#0")
    assert set(tracker.held) == {"b#0", "c#0"}
    tracker.drain_changes()
    tracker.finish("a#0", answered=False)  # a's relQuery was cancelled while it ran
    assert list(tracker.waiting) == ["b#0", "c#0"] and not tracker.held
    assert tracker.drain_changes() == ({"b", "c"}, {"a"})  # both re-ranked
    # Both wait: one admission of the two, and the one that starts holds the other.
    both = StepPlan((PrefillChunk("b#0", 50), PrefillChunk("c#0", 50)))
    assert tracker.unshared(both) == StepPlan((PrefillChunk("b#0", 50),))
    view.start("b#0")
    assert set(tracker.held) == {"c#0"}
    # Preempted, the running twin hands over too: both wait again.
    tracker.requeue("b#0")
    assert set(tracker.waiting) == {"b#0", "c#0"} and not tracker.held


def test_a_request_arriving_after_its_twin_answered_runs():
    view = engine()
    view.add_relquery("a", [50], max_tokens=20, shares={0: "k"})
    view.add_relquery("b", [50], max_tokens=20, shares={0: "k"})
    view.start("a#0")
    view.tracker.finish("a#0", answered=True)  # b#0 stays held until it is aborted
    view.add_relquery("c", [50], max_tokens=20, shares={0: "k"})
    assert "c#0" in view.tracker.waiting and "b#0" in view.tracker.held
    view.tracker.finish("b#0", answered=False)
    assert "c#0" in view.tracker.waiting and "b#0" not in view.tracker


GREEDY_ROW = RelQuery("q", Template("{x}"), [Row("r", {"x": "1"})], 4, sampling=Sampling())


def test_each_relquery_sends_the_request_and_the_first_answer_serves_all():
    key = request_key(GREEDY_ROW, [5, 6], "smollm2")

    async def scenario():
        shared = SharedRequests()
        big, big_again = shared.role(key, "big"), shared.role(key, "big")
        small = shared.role(key, "small")
        waiting = asyncio.ensure_future(shared.answer_of(big_again))
        shared.settle(small, SharedOutcome("text", 1))  # SMALL's request finished first
        return big.leads, big_again.leads, small.leads, big.future.result(), await waiting

    assert asyncio.run(scenario()) == (
        True,
        False,
        True,
        SharedOutcome("text", 1),
        SharedOutcome("text", 1),
    )


def test_a_cancelled_twin_leaves_the_others_and_its_followers_lead_once_again():
    key = request_key(GREEDY_ROW, [7], "smollm2")

    async def scenario():
        shared = SharedRequests()
        lead, other = shared.role(key, "l"), shared.role(key, "o")
        shared.settle(lead, None)  # L's relQuery cancelled: O's request still answers
        still_open = not other.future.done()
        shared.settle(other, None)  # O cancelled too: nothing of the key is left
        followers = [shared.role(key, "f") for _ in range(3)]
        shared.settle(lead, SharedOutcome("late", 1))  # settled already: ignored
        return still_open, lead.future.result(), [role.leads for role in followers]

    # The last three rows of one relQuery: one request, two followers (not three requests).
    assert asyncio.run(scenario()) == (True, None, [True, False, False])


def test_cached_and_shared_rows_have_their_own_metrics_not_generated_tokens():
    rows = [
        RowResult(0, "ran", RowStatus.OK, "a", output_tokens=5),
        RowResult(1, "cache", RowStatus.OK, "b", output_tokens=3, cached=True),
        RowResult(2, "twin", RowStatus.OK, "c", output_tokens=4, shared=True),
    ]
    result = RelQueryResult("q", rows, None, "relstream", "smollm2")
    metrics = EngineMetrics()
    metrics.observe_result(result, service_seconds=2.0)

    def sample(name, **labels):
        return metrics.registry.get_sample_value(name, labels)

    assert sample("relstream_output_tokens_total") == 5  # only the row that ran
    assert sample("relstream_output_tokens_per_second") == 2.5
    assert sample("relstream_rows_from_answer_cache_total") == 1
    assert sample("relstream_rows_shared_total") == 1
    assert sample("relstream_output_tokens_reused_total", source="cache") == 3
    assert sample("relstream_output_tokens_reused_total", source="shared") == 4
    assert sample("relstream_rows_total", status="ok") == 3
    assert metrics_message(result, "engine").output_tokens == 5
