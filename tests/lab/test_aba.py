import pytest

from relstream.scheduler import CostModel, Linear
from relstream_lab.baselines.aba import (
    Arrangement,
    Case,
    PrefillCandidate,
    arrange,
    classify,
    delta,
)

RUNNING = (1.0, 0.0, "a")  # (Prio, arrival, id) of the best running relQuery
WAITING = (2.0, 1.0, "b")


def test_cases_by_priority_keys():
    assert classify((3.0, 0.0, "a"), WAITING) is Case.PREEMPT
    assert classify(WAITING, WAITING) is Case.INTERNAL
    assert classify(RUNNING, WAITING) is Case.TRANSITIONAL


def test_delta_by_hand(cost):
    # p: 100 uncached tokens, 2 requests, OL 10; running OLs 5 and 20; 3 waiting relQueries.
    # Δ+ = L_prefill(100)·2 + 0.1·2·min(5,10) + 0.1·2·min(20,10) = 1.5·2 + 1 + 2 = 6
    # Δ- = −3 · 1.0 · min(10, 20) = −30
    candidate = PrefillCandidate(uncached_tokens=100, requests=2, output_length=10)
    assert delta(candidate, [5, 20], 3, cost) == pytest.approx(-24.0)


def test_preempt_and_internal_always_prefill(cost):
    candidate = PrefillCandidate(10_000, 50, 100)  # Δ would be hugely positive
    for m_plus in [(3.0, 0.0, "a"), WAITING]:
        for arrangement in Arrangement:
            decision = arrange(m_plus, WAITING, candidate, [1], 1, cost, arrangement)
            assert decision.prefill and decision.delta is None


def test_transitional_prefills_when_delta_negative(cost):
    candidate = PrefillCandidate(100, 2, 10)
    decision = arrange(RUNNING, WAITING, candidate, [5, 20], 3, cost)
    assert decision.case is Case.TRANSITIONAL
    assert decision.delta == pytest.approx(-24.0) and decision.prefill


def test_transitional_decodes_when_delta_positive(cost):
    # Δ+ = L_prefill(200)·1 + 0.1·2·min(2,10) = 2.5 + 0.4 = 2.9; Δ- = −1·1.0·min(10,2) = −2
    candidate = PrefillCandidate(200, 2, 10)
    decision = arrange(RUNNING, WAITING, candidate, [2], 1, cost)
    assert decision.delta == pytest.approx(0.9) and not decision.prefill


def test_transitional_decodes_when_delta_is_zero():
    # Exact binary fractions: Δ+ = 2·1 + 0.25·2·min(2,10) = 3; Δ- = −1·1.5·min(10,2) = −3.
    cost = CostModel(prefill=Linear(0.0, 2.0), decode=Linear(0.25, 1.5))
    decision = arrange(RUNNING, WAITING, PrefillCandidate(123, 2, 10), [2], 1, cost)
    assert decision.delta == 0.0 and not decision.prefill


def test_ablations_fix_the_transitional_choice(cost):
    candidate = PrefillCandidate(100, 2, 10)  # adaptive would prefill (Δ = −24)
    assert (
        arrange(RUNNING, WAITING, candidate, [5, 20], 3, cost, Arrangement.DECODE_FIRST).prefill
        is False
    )
    candidate = PrefillCandidate(200, 2, 10)  # adaptive would decode (Δ = 0.9)
    assert (
        arrange(RUNNING, WAITING, candidate, [2], 1, cost, Arrangement.PREFILL_FIRST).prefill
        is True
    )
