"""`bench gpu-steps`: the decoder's shape counted as Llama-3-8B's, steps timed with torch
on the CPU (a tiny shape), and the profile fitted from steps a person can compute."""

import pytest
import torch

from relstream_lab.device.fit import fit_profile
from relstream_lab.device.steps import ARCHITECTURES, time_steps


def test_the_8b_shape_counts_llama_3_8bs_parameters_and_kv():
    arch = ARCHITECTURES["llama8b"]
    assert arch.parameters == pytest.approx(8.03e9, rel=0.001)
    assert arch.kv_bytes_per_token(2) == 131_072  # 2 × 32 layers × 8 heads × 128 × 2 bytes


def test_steps_are_timed_where_their_kv_fits():
    steps = time_steps(
        ARCHITECTURES["tiny"], "cpu", torch.float32, repeats=1, batches=(1, 4),
        contexts=(64, 128), prompts=(16, 64), kv_tokens_at_most=256,
    )  # fmt: skip
    kinds = [(s["kind"], s.get("tokens") or (s["batch"], s["context"])) for s in steps]
    # 4 × 128 = 512 tokens of KV is over 256: not timed
    assert kinds == [("prefill", 16), ("prefill", 64), ("decode", (1, 64)), ("decode", (4, 64)),
                     ("decode", (1, 128))]  # fmt: skip
    assert all(s["seconds"] > 0 for s in steps)


def test_the_profile_is_fitted_from_the_steps_and_the_devices_memory():
    # prefill = 10 ms + 0.1 ms × T; decode = 20 ms + 0.05 ms × B + 1 µs × B·C, exactly
    steps = [{"kind": "prefill", "tokens": t, "seconds": 0.01 + 1e-4 * t} for t in (100, 1000)]
    steps += [
        {"kind": "decode", "batch": b, "context": c, "seconds": 0.02 + 5e-5 * b + 1e-6 * b * c}
        for b in (1, 8, 64) for c in (256, 1024)
    ]  # fmt: skip
    document = {"arch": "llama8b", "parameters": 8.03e9, "dtype": "torch.bfloat16",
                "device": "H200", "memory_bytes": 80 * 2**30, "weight_bytes": 16.06e9,
                "kv_bytes_per_token": 131_072, "steps": steps}  # fmt: skip
    profile = fit_profile(document, "h200")
    assert (profile["prefill_base"], profile["prefill_per_token"]) == pytest.approx((0.01, 1e-4))
    assert (profile["decode_base"], profile["decode_per_request"],
            profile["decode_per_context_token"]) == pytest.approx((0.02, 5e-5, 1e-6))  # fmt: skip
    # (0.9 × 80 GiB - 16.06 GB of weights - 5 GB) / 131,072 = 429,148.95 -> 429,136 (16s)
    assert profile["limits"] == {"max_num_seqs": 1024, "max_num_batched_tokens": 8192,
                                 "kv_capacity_tokens": 429_136, "block_size": 16}  # fmt: skip
    assert profile["fit"]["decode_worst_relative_error"] < 1e-9
