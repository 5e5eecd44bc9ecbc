"""The simulator's step profile fitted from timed steps (`steps.py`'s steps.json): the
paper's two lines, a decode's context as a third term, and vLLM's limits for the
device's memory, in the form `relstream.sim.profiles` reads (kind "linear")."""

from __future__ import annotations

import numpy as np

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of the device's memory
ACTIVATIONS_BYTES = 5e9  # activations and CUDA graphs, as h100-llama8b's derivation
BLOCK = 16
BIG_GPU_BYTES = 70 * 2**30  # vLLM V1's larger defaults from this much memory on


def limits(document: dict) -> dict:
    """vLLM V1's default limits on the device timed, and the KV its memory leaves."""
    memory = document.get("memory_bytes")
    big = memory is not None and memory >= BIG_GPU_BYTES
    if memory is None:  # a CPU run: the tokens the timing allowed
        kv_tokens = max(s["batch"] * s["context"] for s in document["steps"] if "batch" in s)
    else:
        free = GPU_MEMORY_UTILIZATION * memory - document["weight_bytes"] - ACTIVATIONS_BYTES
        kv_tokens = int(free // document["kv_bytes_per_token"])
    return {
        "max_num_seqs": 1024 if big else 256,
        "max_num_batched_tokens": 8192 if big else 2048,
        "kv_capacity_tokens": kv_tokens // BLOCK * BLOCK,
        "block_size": BLOCK,
    }


def fit_profile(document: dict, name: str) -> dict:
    """A linear profile: prefill = base + per token × T; decode = base + per request × B
    + per context token × B·C; with each line's largest relative error over the steps."""
    prefill = [s for s in document["steps"] if s["kind"] == "prefill"]
    decode = [s for s in document["steps"] if s["kind"] == "decode"]
    p_design = np.array([[1.0, s["tokens"]] for s in prefill])
    p_seconds = np.array([s["seconds"] for s in prefill])
    d_design = np.array([[1.0, s["batch"], s["batch"] * s["context"]] for s in decode])
    d_seconds = np.array([s["seconds"] for s in decode])
    (p_base, per_token), *_ = np.linalg.lstsq(p_design, p_seconds, rcond=None)
    (d_base, per_request, per_context), *_ = np.linalg.lstsq(d_design, d_seconds, rcond=None)
    worst = lambda design, coef, seconds: float(np.max(np.abs(design @ coef / seconds - 1)))  # noqa: E731
    return {
        "name": name,
        "kind": "linear",
        "description": f"{document['arch']} ({document['parameters'] / 1e9:.2f}e9 parameters, "
        f"{document['dtype']}) with random weights on {document['device']}, timed by "
        "relstream-lab bench gpu-steps (torch alone, no vLLM): prefill and decode lines.",
        "limits": limits(document),
        "prefill_per_token": max(float(per_token), 0.0),
        "prefill_base": max(float(p_base), 0.0),
        "decode_per_request": max(float(per_request), 0.0),
        "decode_base": max(float(d_base), 0.0),
        "decode_per_context_token": max(float(per_context), 0.0),
        "fit": {
            "prefill_steps": len(prefill),
            "decode_steps": len(decode),
            "prefill_worst_relative_error": worst(p_design, [p_base, per_token], p_seconds),
            "decode_worst_relative_error": worst(
                d_design, [d_base, per_request, per_context], d_seconds
            ),
        },
    }
