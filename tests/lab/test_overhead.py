"""The streaming benchmark's paired Kafka overhead, on runs a person can check."""

import pytest

from relstream_lab.streaming.overhead import paired_overhead


def test_each_kafka_run_is_set_against_the_direct_runs_beside_it():
    # Direct runs 10, 12, 10 s around Kafka runs of 11.55 and 10.45 s: both neighbours'
    # means are 11 s, so the paired overheads are +5 % and -5 %, their mean 0.
    overhead = paired_overhead([10.0, 12.0, 10.0], [11.55, 10.45])
    assert overhead.paired == pytest.approx((0.05, -0.05))
    assert overhead.mean == pytest.approx(0.0)
    # stdev of (+0.05, -0.05) is 0.0707; t(1 df) = 12.706; half = 12.706 * 0.0707 / sqrt 2
    assert overhead.high == pytest.approx(0.6353, abs=1e-4)
    assert overhead.low == pytest.approx(-0.6353, abs=1e-4)
    assert not overhead.established_below(0.05)


def test_a_tight_interval_under_the_goal_establishes_it():
    # Paired overheads +1 %, +2 %, +3 %: mean 2 %, stdev 1 %, t(2 df) = 4.303,
    # half = 4.303 * 0.01 / sqrt 3 = 2.48 %: the interval tops out at 4.48 % < 5 %.
    overhead = paired_overhead([10.0, 10.0, 10.0, 10.0], [10.1, 10.2, 10.3])
    assert overhead.high == pytest.approx(0.0448, abs=1e-4)
    assert overhead.established_below(0.05)
    assert not overhead.established_below(0.04)


def test_one_kafka_run_gives_no_interval_and_never_establishes_a_goal():
    overhead = paired_overhead([10.0, 10.0], [9.0])
    assert overhead.mean == pytest.approx(-0.1)
    assert overhead.low is None and overhead.high is None
    assert not overhead.established_below(0.05)


def test_runs_that_do_not_interleave_are_refused():
    with pytest.raises(ValueError, match="one more direct run than Kafka runs, got 2 and 2"):
        paired_overhead([10.0, 10.0], [10.0, 10.0])
