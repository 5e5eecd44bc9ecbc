import pytest

from relstream.scheduler.data import EngineLimits
from relstream_lab.baselines.pem import batch_decompose, pem


def test_algorithm1_flushes_on_token_budget_and_kv_capacity():
    # mns=4, mnbt=100, cap=250; five requests of 60 uncached tokens, OL=3.
    # r1..r4 each overflow p (60+60>100) → four single-request prefill batches; r5 would
    # push accum to 300 > 250 → decode {r1..r4} OL=3 times, then start over with r5.
    limits = EngineLimits(
        max_num_seqs=4, max_num_batched_tokens=100, kv_capacity_tokens=250, block_size=16
    )
    plan = batch_decompose([60, 60, 60, 60, 60], 3, limits)
    assert plan.prefill_batches == [60, 60, 60, 60, 60]
    assert plan.decode_batches == [(4, 3), (1, 3)]


def test_algorithm1_flushes_on_max_num_seqs():
    limits = EngineLimits(
        max_num_seqs=2, max_num_batched_tokens=1000, kv_capacity_tokens=10**6, block_size=16
    )
    plan = batch_decompose([10, 20, 30], 2, limits)
    assert plan.prefill_batches == [30, 30]
    assert plan.decode_batches == [(2, 2), (1, 2)]


def test_pem_sums_batch_predictions(cost):
    limits = EngineLimits(
        max_num_seqs=4, max_num_batched_tokens=100, kv_capacity_tokens=250, block_size=16
    )
    # 5 prefills of 60 tokens: 5 × (0.01·60 + 0.5) = 5.5
    # decodes: 3 × (0.1·4 + 1) + 3 × (0.1·1 + 1) = 4.2 + 3.3 = 7.5
    assert pem([60] * 5, 3, limits, cost) == pytest.approx(13.0)


def test_pem_of_nothing_waiting_is_zero(cost, roomy_limits):
    assert pem([], 50, roomy_limits, cost) == 0.0
