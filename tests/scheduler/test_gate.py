"""The Δ gate and the load that weighs it, on cases computed by hand."""

import random

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, Linear
from relstream.scheduler.data import EngineLimits
from relstream.scheduler.gate import RunningSet, admission_pays
from relstream.scheduler.headroom import Headroom, StepWork
from relstream.scheduler.paperlines import Coefficients
from relstream.scheduler.relstream_policy import Relstream, RelstreamConfig
from relstream.scheduler.remaining import Remaining
from relstream_lab.policies import RelstreamUngated

# b = 20 ms per step, 1 ms per prompt token, 2 ms per decode.
C = Coefficients(base=0.02, per_token=0.001, per_decode=0.002, batch=10)
RUNNING = Remaining(rows=10, prompt_tokens=0, output_tokens=100, steps=10)
CANDIDATE = Remaining(rows=5, prompt_tokens=500, output_tokens=50, steps=10)


@pytest.mark.parametrize(("behind", "pays"), [(1, False), (3, True)])
def test_admission_pays_once_enough_relqueries_wait_behind_it(behind, pays):
    # Δ+ = 1 × 1 ms × 500 + 2 ms × 5 rows × min(10, 10) = 0.6 s (delay put on S).
    # Δ- = T(S) − shared + behind × b × min(10, 10), T(S) = 20 ms × 10 + 2 ms × 100 = 0.4,
    # shared = 2 ms × min(100, 10 × 10) = 0.2: Δ = 0.6 − 0.2 − 0.2 × behind, negative
    # (admit now) only past 2 relQueries behind; at 2 it is 0, and 0 holds back.
    assert admission_pays([RUNNING], CANDIDATE, behind, C) is pays


def test_a_relquery_is_admitted_at_once_when_nothing_runs():
    assert admission_pays([], CANDIDATE, 0, C)
    assert admission_pays(RunningSet(), CANDIDATE, 0, C)


def delta(running: list[Remaining], candidate: Remaining, behind: float, c) -> float:
    """Δ summed over S afresh, as the gate computed it before S kept its sums."""
    longest = max(left.steps for left in running)
    overlap = sum(min(candidate.steps, left.steps) for left in running)
    increase = (
        len(running) * c.per_token * candidate.prompt_tokens
        + c.per_decode * candidate.rows * overlap
    )
    alone = (
        c.per_token * sum(left.prompt_tokens for left in running)
        + c.base * longest
        + c.per_decode * sum(left.output_tokens for left in running)
    )
    shared = c.per_decode * sum(
        min(left.output_tokens, left.rows * candidate.steps) for left in running
    )
    return increase - (alone - shared + behind * c.base * min(candidate.steps, longest))


def test_the_running_sets_kept_sums_weigh_each_candidate_as_summing_afresh_would():
    # Integers summed in any order are the same integers: Δ is the same float, so the
    # gate decides as it did when it walked S for every candidate.
    rng = random.Random(1)
    for _ in range(300):
        c = Coefficients(rng.random() * 0.05, rng.random() * 1e-3, rng.random() * 5e-3, 7)
        running = RunningSet()
        members: list[Remaining] = []
        for _ in range(rng.randint(1, 30)):
            steps = rng.choice([1, 4, 16, rng.randint(1, 200)])
            rows = rng.randint(1, 60)
            left = Remaining(rows, rng.randint(0, 5000), rows * rng.randint(1, steps), steps)
            running.add(left)
            members.append(left)
            candidate = Remaining(rng.randint(1, 9), rng.randint(0, 900), rng.randint(1, 99),
                                  rng.randint(1, 64))  # fmt: skip
            behind = rng.choice([0, 1, 5, rng.random() * 100])
            expected = delta(members, candidate, behind, c) < 0
            assert admission_pays(running, candidate, behind, c) is expected
            assert admission_pays(members, candidate, behind, c) is expected


def headroom(scale: float, window: int = 4, finished: int = 40) -> Headroom:
    """Four arrivals (0-30 s) of 10 rows; by 100 s a gated engine did, scaled by `scale`,
    1 unit of full-batch work in 2 s of held steps (yield e_g = 0.5) and 3 units in 3 s of
    free steps (e_f = 1): φ = 1/4 of its work held, and `finished` rows finished. Load
    ρ = 4·scale / 100 s, so with as many rows finished as arrived a gated engine is busy
    ρ · (0.25 / 0.5 + 0.75 / 1) = scale / 20 of the time."""
    room = Headroom(window=window)
    for at in (0.0, 10.0, 20.0, 30.0):
        room.arrived(at, rows=10)
    room.executed(StepWork(50.0, 1.0 * scale, 2.0 * scale, held=True, gated=True))
    room.executed(StepWork(90.0, 3.0 * scale, 3.0 * scale, held=False, gated=True))
    room.finished(90.0, rows=finished)
    return room


@pytest.mark.parametrize(("scale", "pressure"), [(15.0, 2 * 2**0.5), (18.75, 8.0)])
def test_the_pressure_is_what_arrives_before_the_backlog_clears(scale, pressure):
    # λ = 4 arrivals / 100 s, a backlog of 25 engine seconds: λ·B = 1 relQuery at
    # today's pace. Busy r = scale / 20: 0.75 stretches it by 1 / 0.25^0.75 = 2√2;
    # 0.9375 by 1 / (1/16)^0.75 = 8.
    room = headroom(scale)
    assert room.busy_when_gated(100.0) == pytest.approx(scale / 20)
    assert room.pressure(100.0, backlog=25.0) == pytest.approx(pressure)


def test_with_no_backlog_a_busy_stream_puts_no_pressure():
    # Busy 0.9375, but nothing is left to do: a lost second delays nobody who arrives.
    assert headroom(18.75).pressure(100.0, backlog=0.0) == 0.0


def test_a_growing_backlog_counts_as_load():
    # The same engine, but only 20 of the 40 rows that arrived in the window finished:
    # the stream brought twice what the engine did, busy = 2 × 15 / 20 = 1.5: capped at
    # 0.999, one backlog second weighs 0.04 / 0.001^0.75 ≈ 7.1 relQueries (V1's batches).
    room = headroom(15.0, finished=20)
    assert room.busy_when_gated(100.0) == pytest.approx(1.5)
    assert room.pressure(100.0, backlog=25.0) == pytest.approx(0.04 * 25 / 0.001**0.75)


def test_before_a_window_of_arrivals_there_is_no_pressure():
    room = Headroom(window=4)
    room.arrived(0.0, rows=10)
    room.executed(StepWork(5.0, 100.0, 5.0, held=True, gated=True))
    assert room.busy_when_gated(10.0) is None and room.pressure(10.0, backlog=100.0) == 0.0


# b = 25 ms, a_p = 1 ms, a_d = 2.5 ms; 64 seats, a budget of 512 tokens.
SMALL_COST = CostModel(prefill=Linear(0.001, 0.025), decode=Linear(0.0025, 0.025))


def two_relqueries() -> ScriptedView:
    view = ScriptedView(EngineLimits(64, 512, 100_000, 16))
    view.add_relquery("big", [50] * 20, max_tokens=20, arrival=0.0)
    view.add_relquery("small", [50] * 2, max_tokens=20, arrival=0.1)
    return view


def test_at_light_load_the_gate_holds_the_big_relquery_back():
    # small (2 rows, 100 prompt tokens, 40 output, 20 steps) is admitted first. big (20
    # rows, 1,000 tokens, 20 steps): Δ+ = 1 ms × 1,000 + 2.5 ms × 20 × 20 = 2.0 s,
    # Δ- = (0.1 + 25 ms × 20 + 2.5 ms × 40) − 2.5 ms × min(40, 40) + 0 behind = 0.6 s:
    # Δ = 1.4 s ≥ 0, big waits. V1's batches would take 9 of big's rows too.
    gated = Relstream(SMALL_COST).plan(two_relqueries())
    assert [c.request_id for c in gated.prefill] == ["small#0", "small#1"]
    full = RelstreamUngated(SMALL_COST, RelstreamConfig()).plan(two_relqueries())
    assert len(full.prefill) == 11


def test_under_pressure_the_gate_admits_as_v1_would():
    # busy 0.98 or more once the two relQueries' arrivals join the window of six (λ =
    # 6 / 100 s); the backlog is both relQueries, 1 ms × 1,100 prompt tokens + (2.5 + 25)
    # ms × 440 outputs = 13.2 s: a lost second delays 0.06 × 13.2 / 0.02^0.75 ≈ 15
    # relQueries or more, big's Δ- gains 15 × 25 ms × min(20, 20) steps = 7.4 s > 1.4 s
    # and it is admitted: small's 2 rows and 9 of big's fill the step.
    policy = Relstream(SMALL_COST)
    policy.headroom = headroom(19.6, window=6)
    view = two_relqueries()
    view.clock = 100.0
    assert len(policy.plan(view).prefill) == 11
