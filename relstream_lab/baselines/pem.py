"""Batch decomposition (paper Algorithm 1) and the Priority Estimation Model (PEM).

PEM(R_t) = Σ_{p∈P} L_prefill(p) + Σ_{d∈D} L_decode(d),  (P, D) = batch_decompose(R_t)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from relstream.scheduler.data import EngineLimits
from relstream.scheduler.paperlines import CostModel


@dataclass
class Decomposition:
    """Prefill batches as their uncached-token totals; decode batches as (size, repeats),
    since Algorithm 1 appends the same decode batch OL(R) times."""

    prefill_batches: list[float] = field(default_factory=list)
    decode_batches: list[tuple[int, int]] = field(default_factory=list)


def batch_decompose(
    uncached_tokens: Sequence[float], output_length: int, limits: EngineLimits
) -> Decomposition:
    """Algorithm 1 over the waiting requests of one relQuery, in queue order.

    `uncached_tokens[i]` is utok(r_i). One deviation, on purpose: `accum` restarts at 0
    when a group has decoded to completion (the pseudo-code never resets it), because
    that group's KV cache is freed by then.
    """
    plan = Decomposition()
    prefill_tokens = 0.0  # utok(p)
    prefill_size = 0  # |p|
    decode_size = 0  # req(d)
    accum = 0.0
    for utok in uncached_tokens:
        if utok + accum > limits.kv_capacity_tokens or decode_size + 1 > limits.max_num_seqs:
            if prefill_size:  # lines 4-8: the GPU is full, decode this group to completion
                plan.prefill_batches.append(prefill_tokens)
            if decode_size:
                plan.decode_batches.append((decode_size, output_length))
            prefill_tokens, prefill_size, decode_size, accum = 0.0, 0, 0, 0.0
        if prefill_size and utok + prefill_tokens > limits.max_num_batched_tokens:
            plan.prefill_batches.append(prefill_tokens)  # lines 9-10: p is full
            prefill_tokens, prefill_size = 0.0, 0
        prefill_tokens += utok
        prefill_size += 1
        decode_size += 1
        accum += utok
    if prefill_size:  # lines 12-15: leftover batches
        plan.prefill_batches.append(prefill_tokens)
    if decode_size:
        plan.decode_batches.append((decode_size, output_length))
    return plan


def decomposition_cost(plan: Decomposition, cost: CostModel) -> float:
    prefill = sum(cost.prefill_time(tokens) for tokens in plan.prefill_batches)
    decode = sum(repeats * cost.decode_time(size) for size, repeats in plan.decode_batches)
    return prefill + decode


def pem(
    waiting_uncached: Sequence[float],
    output_length: int,
    limits: EngineLimits,
    cost: CostModel,
) -> float:
    """Estimated execution time of what remains of a relQuery.

    Requests already prefilled have utok = 0 and leave the decomposition (paper §4.2,
    after Algorithm 1), so a relQuery whose prompts are all computed has Prio 0: that is
    what makes m+ < m- mark the transitional case in the ABA.
    """
    plan = batch_decompose(waiting_uncached, output_length, limits)
    return decomposition_cost(plan, cost)
