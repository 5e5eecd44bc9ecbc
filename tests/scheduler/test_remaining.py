"""What is left of a relQuery, kept from the tracker's sums, equals the count over every
row, whatever the tracker went through."""

import random

from relstream.scheduler.data import SeqInfo
from relstream.scheduler.remaining import (
    Remaining,
    RemainingBook,
    expected_output,
    remaining,
    row_remaining_output,
)
from relstream.scheduler.tracker import RequestTracker


def every_row(info):
    """The same estimate visiting every row (an oracle that answers as the estimate)."""
    expected = expected_output(info)
    return remaining(info, oracle=lambda seq: row_remaining_output(seq, expected))


def test_sums_match_every_row_through_admissions_preemptions_and_finishes():
    rng = random.Random(7)
    tracker = RequestTracker()
    for relquery in ("a", "b"):
        for row in range(40):
            budget = rng.choice((8, 8, 8, 3))  # mostly one output budget, some another
            seq = SeqInfo(f"{relquery}#{row}", relquery, rng.randint(5, 60), budget, 0.0)
            tracker.add_request(seq, relquery_size=50)  # 10 rows still on their way
    for _ in range(2_000):
        op = rng.random()
        if op < 0.3 and tracker.waiting:
            seq = tracker.start(rng.choice(list(tracker.waiting)))
            tracker.record_progress(seq, computed=seq.prompt_tokens, generated=1)
        elif op < 0.6 and tracker.running:
            seq = tracker.running[rng.choice(list(tracker.running))]
            tracker.record_progress(seq, computed=1, generated=1)
        elif op < 0.7 and tracker.running:
            tracker.requeue(rng.choice(list(tracker.running)))  # preempted, with output
        elif op < 0.85 and tracker.running:
            tracker.finish(rng.choice(list(tracker.running)))
        elif tracker.waiting:
            tracker.finish(rng.choice(list(tracker.waiting)))  # aborted before it ran
        for info in tracker.relqueries.values():
            assert remaining(info) == every_row(info)


def test_a_waiting_row_that_never_ran_is_only_counted():
    # Three rows of 10 prompt tokens, budget 4, nothing finished: P = 30, O = 12, L = 4,
    # and none of them is visited (the tracker holds their sums).
    tracker = RequestTracker()
    for row in range(3):
        tracker.add_request(SeqInfo(f"q#{row}", "q", 10, 4, 0.0), relquery_size=3)
    info = tracker.relqueries["q"]
    assert (info.fresh_prompt_tokens, dict(info.fresh_rows), info.resumed) == (30, {4: 3}, {})
    left = remaining(info)
    assert (left.rows, left.prompt_tokens, left.output_tokens, left.steps) == (3, 30, 12, 4)


def test_the_book_keeps_the_backlog_as_relqueries_come_change_and_go():
    book = RemainingBook()
    book["a"] = Remaining(rows=2, prompt_tokens=100, output_tokens=40, steps=20)
    book["b"] = Remaining(rows=1, prompt_tokens=50, output_tokens=10, steps=10)
    book["a"] = Remaining(rows=1, prompt_tokens=0, output_tokens=15, steps=15)  # a ran
    del book["b"]
    assert (book.prompt_tokens, book.output_tokens) == (0, 15)
    assert book.total() == Remaining(0, 0, 15, 0)
