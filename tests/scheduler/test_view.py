from hypothesis import example, given, settings
from hypothesis import strategies as st

from relstream.scheduler.data import SeqInfo
from relstream.scheduler.tracker import RequestTracker


def test_recompute_after_preemption_covers_prompt_and_output():
    tracker = RequestTracker()
    seq = SeqInfo("r#0", "r", prompt_tokens=100, max_tokens=10, arrival_time=0.0)
    tracker.add_request(seq, relquery_size=1)
    assert not seq.prefill_done and seq.uncomputed_tokens == 100
    tracker.start("r#0")
    tracker.record_progress(seq, computed=100, generated=1)  # prefill samples a token
    assert seq.prefill_done and seq.uncomputed_tokens == 1
    for _ in range(4):
        tracker.record_progress(seq, computed=1, generated=1)
    tracker.requeue("r#0")
    assert "r#0" in tracker.waiting and not tracker.active_relqueries
    assert not seq.prefill_done and seq.uncomputed_tokens == 105
    tracker.start("r#0")
    tracker.record_progress(seq, computed=105, generated=1)
    assert seq.prefill_done and seq.output_tokens == 6


def test_tracker_reports_a_relquery_done_with_its_last_request():
    tracker = RequestTracker()
    for row in range(2):
        tracker.add_request(SeqInfo(f"r#{row}", "r", 10, 5, 0.0), relquery_size=2)
    tracker.start("r#0")
    assert tracker.finish("r#0") is None
    done = tracker.finish("r#1")  # finishing straight from waiting (e.g. aborted) works too
    assert done is not None and done.finished == 2 and "r" not in tracker.relqueries
    assert tracker.drain_changed() == set()


def test_a_drain_names_the_relqueries_that_finished_since_the_last():
    tracker = RequestTracker()
    tracker.add_request(SeqInfo("a#0", "a", 10, 5, 0.0), relquery_size=1)
    tracker.add_request(SeqInfo("b#0", "b", 10, 5, 0.0), relquery_size=1)
    assert tracker.drain_changes() == ({"a", "b"}, set())
    tracker.start("a#0")
    tracker.finish("a#0")
    tracker.record_progress(tracker.waiting["b#0"], computed=0)
    assert tracker.drain_changes() == ({"b"}, {"a"})
    assert tracker.drain_changes() == (set(), set())


def test_prompting_rows_are_found_without_visiting_decodes():
    tracker = RequestTracker()
    rows = [
        SeqInfo(f"r#{i}", "r", prompt_tokens=8, max_tokens=4, arrival_time=0.0) for i in range(3)
    ]
    for seq in rows:
        tracker.add_request(seq, relquery_size=3)
    tracker.start("r#0")
    tracker.start("r#1")
    assert list(tracker.prompting) == ["r#0", "r#1"]
    tracker.record_progress(rows[0], computed=8, generated=1)  # prompt done, a token sampled
    tracker.record_progress(rows[1], computed=4)  # half its prompt
    assert list(tracker.prompting) == list(tracker.relqueries["r"].prompting) == ["r#1"]
    tracker.requeue("r#0")  # preempted: prompt and output to compute again, once started
    tracker.start("r#0")
    assert list(tracker.prompting) == ["r#1", "r#0"]
    tracker.finish("r#1", answered=False)
    assert list(tracker.prompting) == ["r#0"]


@settings(max_examples=200, deadline=None)
# a decoding row back to prompting (more generated than computed) stays in running order
@example([("s", 0, 0, 0), ("s", 1, 0, 0), ("p", 0, 4, 1), ("p", 0, 0, 2), ("p", 0, -1, -1)])
@given(
    st.lists(
        st.tuples(
            st.sampled_from("spqf"), st.integers(0, 5), st.integers(-1, 3), st.integers(-1, 3)
        )
    )
)
def test_prompting_is_always_the_running_rows_not_prefill_done(ops):
    """Whatever the engine does, `prompting` (whole and per relQuery) lists exactly the
    running rows whose `prefill_done` is false, in running order."""
    tracker = RequestTracker()
    rows = [SeqInfo(f"{q}#{i}", q, 4, 6, 0.0) for q in "ab" for i in range(3)]
    for seq in rows:
        tracker.add_request(seq, relquery_size=3)
    for op, index, computed, generated in ops:
        seq = rows[index]
        if op == "s" and seq.request_id in tracker.waiting:
            tracker.start(seq.request_id)
        elif op == "p" and seq.request_id in tracker:
            tracker.record_progress(seq, computed, generated)
        elif op == "q" and seq.request_id in tracker.running:
            tracker.requeue(seq.request_id)
        elif op == "f" and seq.request_id in tracker:
            tracker.finish(seq.request_id)
        expected = [rid for rid, s in tracker.running.items() if not s.prefill_done]
        assert list(tracker.prompting) == expected
        for info in tracker.relqueries.values():
            assert list(info.prompting) == [rid for rid in expected if rid in info.running]
