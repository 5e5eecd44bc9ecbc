import random

import pytest

from relstream.scheduler import (
    CostModel,
    Linear,
    OnlineCostModel,
    StepFeedback,
    StepKind,
    cost_model_of,
)


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


def test_online_fit_skips_mixed_steps():
    model = OnlineCostModel(CostModel(Linear(0.001, 0.02), Linear(0.002, 0.05)))
    model.observe(StepFeedback(StepKind.MIXED, 500, 10, 9.0))
    assert model.coefficients() == {
        "alpha_p": 0.001,
        "beta_p": 0.02,
        "alpha_d": 0.002,
        "beta_d": 0.05,
    }
