import math
import random

import pytest

from relstream.scheduler import CostModel, Linear, OnlineCostModel, cost_model_of
from relstream.scheduler.data import StepFeedback, StepKind
from relstream.scheduler.paperlines import RecursiveLeastSquares, SlopeCeiling


def test_fixed_model_ignores_feedback(cost):
    cost.observe(StepFeedback(StepKind.PREFILL, 1000, 0, 99.0))
    assert cost.coefficients() == {"alpha_p": 0.01, "beta_p": 0.5, "alpha_d": 0.1, "beta_d": 1.0}


def test_coefficients_rebuild_the_same_lines(cost):
    rebuilt = CostModel.from_coefficients(cost.coefficients())
    assert rebuilt.prefill_time(100) == cost.prefill_time(100) == 0.01 * 100 + 0.5
    assert rebuilt.decode_time(8) == cost.decode_time(8) == 0.1 * 8 + 1.0


def test_a_fixed_kind_keeps_the_prior_and_an_online_one_refits_from_it(cost):
    assert cost_model_of("fixed", cost) is cost
    online = cost_model_of("online", cost)
    online.observe(StepFeedback(StepKind.DECODE, 0, 10, 9.0))
    assert online.decode_time(10) > cost.decode_time(10) == 2.0
    with pytest.raises(ValueError, match="cost_model must be 'online' or 'fixed'"):
        cost_model_of("offline", cost)


def test_online_fit_learns_true_lines_from_a_wrong_prior():
    rng = random.Random(3)
    model = OnlineCostModel(CostModel(Linear(0.01, 0.5), Linear(0.01, 0.5)))
    for _ in range(300):
        tokens = rng.randint(50, 2000)
        model.observe(StepFeedback(StepKind.PREFILL, tokens, 0, 0.0013 * tokens + 0.020))
        requests = rng.randint(1, 64)
        model.observe(StepFeedback(StepKind.DECODE, 0, requests, 0.0018 * requests + 0.047))
    assert model.prefill.slope == pytest.approx(0.0013, rel=0.02)
    assert model.prefill.intercept == pytest.approx(0.020, rel=0.05)
    assert model.decode.slope == pytest.approx(0.0018, rel=0.02)
    assert model.decode.intercept == pytest.approx(0.047, rel=0.05)


def test_a_slowed_step_does_not_price_every_prompt_token_as_it():
    """Two pure prompt steps, the second slowed fourfold by a process beside it: 200
    tokens in 0.4 s (2 ms each), 400 in 3.2 s (8 ms each). Their line's slope is
    (3.2 - 0.4) / 200 = 14 ms; no token took more than 8 ms, and the ceiling, the low
    decile of the two ratios, is 2 + 0.1 * (8 - 2) = 2.6 ms."""
    model = OnlineCostModel(CostModel(Linear(0.0013, 0.02), Linear(0.0018, 0.047)))
    model.observe(StepFeedback(StepKind.PREFILL, 200, 0, 0.4))
    model.observe(StepFeedback(StepKind.PREFILL, 400, 0, 3.2))
    assert model._prefill_fit.line.slope == pytest.approx(0.014, rel=0.01)  # the line's
    assert model.prefill.slope == pytest.approx(0.0026)  # the price used
    # Its intercept under that slope: the times less 2.6 ms a token, -0.12 s and 2.16 s,
    # their low decile -0.12 + 0.1 * 2.28 = 0.108 s.
    assert model.prefill.intercept == pytest.approx(0.108)
    ceiling = SlopeCeiling()
    assert ceiling.most() == math.inf  # nothing seen, nothing capped
    ceiling.see(0, 1.0)  # a step of no units says nothing
    assert ceiling.most() == math.inf


def test_online_fit_skips_mixed_steps():
    model = OnlineCostModel(CostModel(Linear(0.001, 0.02), Linear(0.002, 0.05)))
    model.observe(StepFeedback(StepKind.MIXED, 500, 10, 9.0))
    assert model.coefficients() == {
        "alpha_p": 0.001,
        "beta_p": 0.02,
        "alpha_d": 0.002,
        "beta_d": 0.05,
    }


def test_hours_of_decodes_of_one_batch_size_do_not_wind_the_fit_up():
    # 200,000 decode steps of 16 requests at 50 ms: unbounded, the covariance reached inf
    # after ~140,000 and the gain divided by zero. The fit then still learns a new line.
    fit = RecursiveLeastSquares(Linear(0.002, 0.02))
    for _ in range(200_000):
        fit.update(16, 0.05)
    assert all(math.isfinite(value) for row in fit.covariance for value in row)
    assert fit.line(16) == pytest.approx(0.05)
    for step in range(2_000):
        batch = 1 + step % 64
        fit.update(batch, 0.001 * batch + 0.03)
    assert (fit.line.slope, fit.line.intercept) == pytest.approx((0.001, 0.03), rel=0.05)


def test_after_hours_at_one_batch_size_a_new_step_time_there_is_learned_in_minutes():
    # Forgetting must survive the bound: 10,000 steps of 16 at 50 ms, then the step
    # slows to 60 ms (a longer context, another model's neighbour); 2,000 steps later the
    # line says 60 ms there (a trace bound cancelled forgetting: the gain fell like 1/n).
    fit = RecursiveLeastSquares(Linear(0.002, 0.02))
    for _ in range(10_000):
        fit.update(16, 0.05)
    for _ in range(2_000):
        fit.update(16, 0.06)
    assert fit.line(16) == pytest.approx(0.06, rel=0.01)
