"""Placement across engines: least outstanding work, the template's engine among ties,
the engine where a relQuery delays fewest among those near the least, the hash when no
report is fresh. Cases computed by hand."""

import msgspec

from relstream.placement.choice import Choice, EngineLoad, Placement, hash_partition
from relstream.placement.load import SIZE_CLASSES, Load, class_work, size_class, size_counts
from relstream.placement.reports import engine_load, load_report
from relstream.wire import LoadReportMessage, decode, encode
from relstream.wire.messages import MAX_SIZE_CLASSES

PRICES = {"per_prompt_token_s": 0.001, "per_output_token_s": 0.01}


def reported(engine, partitions, outstanding_s, at, templates=(), **prices) -> EngineLoad:
    """An engine's report as the placer keeps it, measured at `at`."""
    return EngineLoad(engine, partitions, Load(outstanding_s, templates=templates, **prices), at)


def placement(spread: float = 0.0) -> Placement:
    # Engine a owns partitions 0, 1 with 10 s of work; b owns 2, 3 with 4 s.
    # A prompt token costs each 1 ms, an output token 10 ms. Spread 0: the least work only.
    room = Placement(partitions=4, spread=spread)
    room.report(reported("a", (0, 1), 10.0, at=100.0, **PRICES))
    room.report(reported("b", (2, 3), 4.0, at=100.0, templates=("t1",), **PRICES))
    return room


def test_a_relquery_goes_to_the_engine_with_the_least_work_counting_what_was_sent():
    room = placement()
    # Each relQuery: 1,000 prompt tokens and 200 outputs, 1 + 2 = 3 s. b: 4 → 7 → 10
    # (partitions 2, 3 in turn); then a (10) and b (10) tie, a by name.
    assert [room.choose(b"k", 1000, 200, now=100.5) for _ in range(3)] == [2, 3, 0]
    assert room.estimate("a") == 13.0 and room.estimate("b") == 10.0


def test_among_engines_within_the_margin_the_templates_engine_wins():
    room = placement()
    room.report(reported("a", (0, 1), 4.2, at=101.0, templates=("t2",), **PRICES))
    # a 4.2 and b 4.0 are within 10 % of 4.0: t1's engine b, t2's engine a.
    assert room.choose(b"k", 0, 0, now=101.5, template="t2") in (0, 1)
    assert room.choose(b"k", 0, 0, now=101.5, template="t1") in (2, 3)


def test_a_report_resets_what_was_sent_and_an_older_one_is_ignored():
    room = placement()
    room.choose(b"k", 0, 500, now=100.5)  # 5 s to b: 9
    room.report(reported("b", (2, 3), outstanding_s=6.0, at=101.0))
    assert room.estimate("b") == 6.0
    room.report(reported("b", (2, 3), outstanding_s=1.0, at=100.9))  # late, stale
    assert room.estimate("b") == 6.0


def test_a_report_read_late_keeps_what_was_sent_after_it_was_measured():
    # The HTTP door's race: it keeps a relQuery at 101.5, then reads b's report measured
    # at 101.2 (before the relQuery reached b). What was sent at 100.5 is in that report;
    # the 5 s sent at 101.5 are not, and still count until a report measured after them.
    room = placement()
    room.choose(b"k", 0, 500, now=100.5)  # 5 s to b: 9
    room.choose(b"k", 0, 500, now=101.5)  # b 9 < a 10: to b, 14
    room.choose(b"k", 0, 500, now=101.5)  # a 10 < b 14: to a, 15
    room.report(reported("b", (2, 3), outstanding_s=6.0, at=101.2))
    assert room.estimate("b") == 6.0 + 5.0
    room.report(reported("b", (2, 3), outstanding_s=7.0, at=101.6))
    assert room.estimate("b") == 7.0


def test_without_a_fresh_report_the_key_hash_decides():
    room = placement()
    # Reports of 100 s expire after 3 s; an engine with no partitions is never chosen.
    room.report(reported("c", (), outstanding_s=0.0, at=104.0))
    assert room.choose(b"key-7", 10, 10, now=103.5) == hash_partition(b"key-7", 4)


def test_a_preferred_engine_keeps_a_relquery_only_within_the_margin():
    # The HTTP door of engine a prefers a: no Kafka hop while a is about as idle as b.
    room = placement()
    assert room.pick(0, 0, now=100.5, prefer="a") == Choice("b", 2)  # a 10 s, b 4 s
    room.report(reported("a", (0, 1), 4.3, at=101.0, **PRICES))
    # a 4.3 is within 10 % of b's 4.0 (bound 4.4): a keeps it, though b has t1 warm.
    # 1,000 prompt tokens are 1 s: a 5.3, past the bound, so the next goes to b.
    assert room.pick(1000, 0, now=101.5, template="t1", prefer="a") == Choice("a", 0)
    assert room.pick(0, 0, now=101.5, template="t1", prefer="a") == Choice("b", 3)
    assert room.pick(0, 0, now=105.0, prefer="a") is None  # every report expired


def test_a_size_class_is_a_power_of_two_of_the_work_left():
    # Class k runs from 2**(k-8) s to twice that; below 1/128 s class 0, from 128 s the last.
    assert [size_class(w) for w in (0.0, 0.007, 2**-7, 0.25, 1.0, 1.99, 3.0, 127.9, 500.0)] == [
        0, 0, 1, 6, 8, 8, 9, 14, 15,
    ]  # fmt: skip
    # 0.25 s in class 6, two of 1-2 s in class 8, 3 s in class 9; nothing past it is sent.
    assert size_counts([1.0, 1.5, 0.25, 3.0]) == (0, 0, 0, 0, 0, 0, 1, 0, 2, 1)
    assert size_counts([]) == ()
    assert SIZE_CLASSES == MAX_SIZE_CLASSES  # what the wire bounds a report's classes to


def test_near_the_least_work_a_relquery_goes_where_it_delays_fewest():
    # Each relQuery: 100 output tokens at 10 ms = 1 s, class 8. a: 6 s, two relQueries of
    # 3 s (class 9, larger: both delayed); b: 10 s, twenty of 0.5 s (class 7: none
    # delayed); c: 13 s, one relQuery of 8-16 s (class 11), but over twice the least
    # (12 s) with spread 1.
    room = Placement(partitions=6, spread=1.0)
    room.report(reported("a", (0, 1), 6.0, 100.0, size_counts=(0,) * 9 + (2,), **PRICES))
    counts = (0,) * 7 + (20,)
    room.report(reported("b", (2, 3), 10.0, 100.0, size_counts=counts, **PRICES))
    room.report(reported("c", (4, 5), 13.0, 100.0, size_counts=(0,) * 11 + (1,), **PRICES))
    # b delays 0, then 0.5 and 1 (half of those sent of its own class) against a's 2;
    # at 13 s b is past 12 s and a, the only one left near, takes the fourth.
    assert [room.choose(b"k", 0, 100, now=100.5) for _ in range(4)] == [2, 3, 2, 0]
    assert room.delayed("b", 1.0) == 1.5 and room.delayed("a", 1.0) == 2.5
    # Now a 7 s, b and c 13 s, all within 14 s. A relQuery of 2.5 s (class 9) delays half
    # of a's two, c's one, none on b: b. One of 4 s (class 10) delays c's one, none on a
    # or b: a, the least work.
    assert room.choose(b"k", 0, 250, now=100.6) == 3
    assert room.choose(b"k", 0, 400, now=100.6) == 1
    # A fresh report of b forgets what was sent: its own counts only.
    room.report(reported("b", (2, 3), 2.0, 101.0, size_counts=(0,) * 9 + (1,), **PRICES))
    assert room.delayed("b", 1.0) == 1.0


def test_the_templates_engine_still_wins_among_those_within_the_margin():
    # a and b within 10 %: the template's engine a, though it delays two relQueries there.
    room = Placement(partitions=2, spread=1.0)
    room.report(reported("a", (0,), 4.2, 100.0, ("t",), size_counts=(0,) * 9 + (2,), **PRICES))
    room.report(reported("b", (1,), 4.0, 100.0, **PRICES))
    assert room.choose(b"k", 0, 100, now=100.5, template="t") == 0
    assert room.choose(b"k", 0, 100, now=100.5, template="u") == 1


def test_an_engine_that_does_not_count_its_relqueries_leaves_the_least_work_to_decide():
    # b has work and no counts (an older release): it would look as if it delayed none.
    # Near the least (a, 6 s, two larger relQueries), the least work decides: a. Once b
    # is past the spread (18 s > 9 s), a's counts decide among the rest, a alone.
    room = Placement(partitions=2, spread=0.5)
    room.report(reported("a", (0,), 6.0, 100.0, size_counts=(0,) * 9 + (2,), **PRICES))
    room.report(reported("b", (1,), 8.0, 100.0, **PRICES))
    assert not room.fresh(100.5)[1].load.counted
    assert room.choose(b"k", 0, 100, now=100.5) == 0
    room.report(reported("b", (1,), 18.0, 101.0, **PRICES))
    assert room.choose(b"k", 0, 100, now=101.5) == 0
    # An idle engine counts none and is counted: the rule applies, and b (idle, 0 s)
    # delays no one.
    room.report(reported("b", (1,), 0.0, 102.0, **PRICES))
    assert room.fresh(102.5)[1].load.counted
    assert room.choose(b"k", 0, 100, now=102.5) == 1


def test_a_work_no_fit_should_give_falls_in_the_last_class_not_a_crash():
    assert size_class(float("inf")) == size_class(float("nan")) == SIZE_CLASSES - 1
    assert size_class(1e300) == SIZE_CLASSES - 1


def test_an_idle_engines_report_is_trusted_for_its_heartbeat_a_busy_ones_for_seconds():
    # b idle (its report repeated only every 300 s), a busy: at 100 + 60, a's report of
    # 100 is long expired (3 s) and b's still trusted (750 s); at 100 + 751 neither.
    room = Placement(partitions=4)
    room.report(reported("a", (0, 1), 10.0, at=100.0, **PRICES))
    room.report(reported("b", (2, 3), 0.0, at=100.0, **PRICES))
    assert [r.engine for r in room.fresh(now=102.0)] == ["a", "b"]
    assert [r.engine for r in room.fresh(now=160.0)] == ["b"]
    assert room.fresh(now=851.0) == []


def test_an_idle_engine_silent_after_work_was_sent_to_it_is_taken_for_stopped():
    # b idle since 100; a relQuery sent to it at 400. Alive, it would report at work
    # within a quarter second; silent 10 s after that send (at 410.5) it is no longer
    # chosen, though its idle report is 750 s good. A report after the send trusts it again.
    room = Placement(partitions=4)
    room.report(reported("b", (2, 3), 0.0, at=100.0, **PRICES))
    assert room.choose(b"k", 1000, 200, now=400.0) in (2, 3)
    assert [r.engine for r in room.fresh(now=409.0)] == ["b"]
    assert room.fresh(now=410.5) == []
    room.report(reported("b", (2, 3), 3.0, at=400.2, **PRICES))  # it took the work
    assert [r.engine for r in room.fresh(now=403.0)] == ["b"]


def test_an_engine_publishes_a_changed_report_at_once_and_an_unchanged_one_as_a_heartbeat():
    from relstream.placement.reports import due
    from relstream.wire import LoadReportMessage

    def report(at: float, work: float = 0.0, partitions=(0, 1)) -> LoadReportMessage:
        return LoadReportMessage(engine="e", topic="rq", partitions=list(partitions),
                                 outstanding_s=work, at=at)  # fmt: skip

    last = report(100.0)
    assert due(report(100.25), None, 60.0)  # the first (a 60 s heartbeat here)
    assert not due(report(100.25), last, 60.0)  # idle, unchanged: nothing written
    assert not due(report(159.9), last, 60.0)
    assert due(report(160.0), last, 60.0)  # the heartbeat
    assert due(report(100.25, work=3.5), last, 60.0)  # work arrived
    assert due(report(100.25, partitions=(0,)), last, 60.0)  # a rebalance
    busy = report(100.0, work=3.5)
    assert due(report(100.25, work=3.5), busy, 60.0)  # at work: every look, changed or not


def test_work_is_counted_at_the_relquerys_class_and_above():
    # a: 10 s of backfill (class -1) and 1 s of class 0; b: 4 s, all class 0. A live
    # relQuery (class 0) waits behind 1 s on a (the backfill gives way) and 4 s on b: it
    # goes to a. A backfill relQuery waits behind 11 s on a and 4 s on b: it goes to b.
    # Each is 3 s (1,000 prompt tokens, 200 outputs), counted at its own class after.
    room = Placement(partitions=4, spread=0.0)
    backfill = Load(11.0, class_work=((0, 1.0), (-1, 10.0)), **PRICES)
    room.report(EngineLoad("a", (0, 1), backfill, 100.0))
    room.report(reported("b", (2, 3), 4.0, at=100.0, **PRICES))
    assert room.choose(b"live", 1000, 200, now=100.5, priority=0) == 0
    assert room.estimate("a", 0) == 4.0 and room.estimate("a", -1) == 14.0
    assert room.choose(b"backfill", 1000, 200, now=100.5, priority=-1) == 2
    # A class above every report's waits behind nothing reported, only what was sent.
    assert room.estimate("b", 1) == 0.0 and room.estimate("a", 1) == 0.0
    assert class_work([(0, 1.0), (-1, 4.0), (-1, 6.0)]) == ((0, 1.0), (-1, 10.0))
    assert class_work([(0, 1.0), (0, 2.0)]) == ()  # all class 0: nothing to say


def test_every_field_of_a_load_crosses_the_wire_under_its_name():
    # One shape from the policy to the placer: the report is `Load` field by field, so a
    # field added to `Load` without its wire twin fails here.
    from types import SimpleNamespace

    from aiokafka import TopicPartition

    assert set(Load.__struct_fields__) <= set(LoadReportMessage.__struct_fields__)
    load = Load(7.5, 0.001, 0.02, (0, 2, 1), ("t1", "t0"), ((1, 2.5), (0, 5.0)))
    backend = SimpleNamespace(load=lambda: load)
    consumer = SimpleNamespace(assignment=lambda: {TopicPartition("rq", 3), TopicPartition("x", 1)})
    report = load_report(backend.load, consumer, "rq", "e1")
    assert (report.engine, report.topic, report.partitions) == ("e1", "rq", [3])
    assert engine_load(decode(LoadReportMessage, encode(report))).load == load
    assert load_report(lambda: None, consumer, "rq", "e1") is None


def test_a_reports_class_work_crosses_the_wire():
    message = LoadReportMessage(
        engine="e", topic="t", partitions=[0], outstanding_s=3.0, at=1.0,
        class_work=[(1, 1.0), (-1, 2.0)],
    )  # fmt: skip
    load = engine_load(decode(LoadReportMessage, encode(message))).load
    assert load.class_work == ((1, 1.0), (-1, 2.0)) and load.ahead_of(0) == 1.0
    bad = msgspec.structs.replace(message, class_work=[(0, float("inf"))])
    assert not bad.finite
