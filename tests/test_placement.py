"""Placement across engines: least outstanding work, the template's engine among ties,
the hash when no report is fresh. Cases computed by hand."""

from relstream.scheduler.placement import Choice, EngineLoad, Placement, hash_partition

PRICES = {"per_prompt_token_s": 0.001, "per_output_token_s": 0.01}


def placement() -> Placement:
    # Engine a owns partitions 0, 1 with 10 s of work; b owns 2, 3 with 4 s.
    # A prompt token costs each 1 ms, an output token 10 ms.
    room = Placement(partitions=4)
    room.report(EngineLoad("a", (0, 1), 10.0, at=100.0, **PRICES))
    room.report(EngineLoad("b", (2, 3), 4.0, at=100.0, templates=("t1",), **PRICES))
    return room


def test_a_relquery_goes_to_the_engine_with_the_least_work_counting_what_was_sent():
    room = placement()
    # Each relQuery: 1,000 prompt tokens and 200 outputs, 1 + 2 = 3 s. b: 4 → 7 → 10
    # (partitions 2, 3 in turn); then a (10) and b (10) tie, a by name.
    assert [room.choose(b"k", 1000, 200, now=100.5) for _ in range(3)] == [2, 3, 0]
    assert room.estimate("a") == 13.0 and room.estimate("b") == 10.0


def test_among_engines_within_the_margin_the_templates_engine_wins():
    room = placement()
    room.report(EngineLoad("a", (0, 1), 4.2, at=101.0, templates=("t2",), **PRICES))
    # a 4.2 and b 4.0 are within 10 % of 4.0: t1's engine b, t2's engine a.
    assert room.choose(b"k", 0, 0, now=101.5, template="t2") in (0, 1)
    assert room.choose(b"k", 0, 0, now=101.5, template="t1") in (2, 3)


def test_a_report_resets_what_was_sent_and_an_older_one_is_ignored():
    room = placement()
    room.choose(b"k", 0, 500, now=100.5)  # 5 s to b: 9
    room.report(EngineLoad("b", (2, 3), outstanding_s=6.0, at=101.0))
    assert room.estimate("b") == 6.0
    room.report(EngineLoad("b", (2, 3), outstanding_s=1.0, at=100.9))  # late, stale
    assert room.estimate("b") == 6.0


def test_without_a_fresh_report_the_key_hash_decides():
    room = placement()
    # Reports of 100 s expire after 3 s; an engine with no partitions is never chosen.
    room.report(EngineLoad("c", (), outstanding_s=0.0, at=104.0))
    assert room.choose(b"key-7", 10, 10, now=103.5) == hash_partition(b"key-7", 4)


def test_a_preferred_engine_keeps_a_relquery_only_within_the_margin():
    # The HTTP door of engine a prefers a: no Kafka hop while a is about as idle as b.
    room = placement()
    assert room.pick(0, 0, now=100.5, prefer="a") == Choice("b", 2)  # a 10 s, b 4 s
    room.report(EngineLoad("a", (0, 1), 4.3, at=101.0, **PRICES))
    # a 4.3 is within 10 % of b's 4.0 (bound 4.4): a keeps it, though b has t1 warm.
    # 1,000 prompt tokens are 1 s: a 5.3, past the bound, so the next goes to b.
    assert room.pick(1000, 0, now=101.5, template="t1", prefer="a") == Choice("a", 0)
    assert room.pick(0, 0, now=101.5, template="t1", prefer="a") == Choice("b", 3)
    assert room.pick(0, 0, now=105.0, prefer="a") is None  # every report expired
