from relstream.scheduler import RequestTracker, SeqInfo


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
