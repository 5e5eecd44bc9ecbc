"""Adaptive Batch Arranger (paper §4.3): prefill candidate or decode candidate?

m+ = min Prio over the decode candidate (all running requests), m- = min Prio over the
prefill candidate (one relQuery from the head of the waiting queue).
  m+ > m-: preempt the running relQueries, prefill.
  m+ = m-: the same relQuery is mid-execution, prefill to grow its decode batch.
  m+ < m-: transitional; prefill iff Δ = Δ+ + Δ- < 0 with (eq. increased_latency)
      Δ+ = L_prefill(p)·|R+| + Σ_{R∈R+} α_d·req(p)·min(OL(R), OL(p))
      Δ- = −|R-|·β_d·min(OL(p), max_{R∈R+} OL(R))      (a reduction, hence negative)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from relstream.scheduler.paperlines import CostModel


class Arrangement(Enum):
    ADAPTIVE = "adaptive"  # RelServe
    PREFILL_FIRST = "prefill-first"  # ablation relserve-pp
    DECODE_FIRST = "decode-first"  # ablation relserve-dp


class Case(Enum):
    PREEMPT = "preempt"  # m+ > m-
    INTERNAL = "internal"  # m+ = m-
    TRANSITIONAL = "transitional"  # m+ < m-


@dataclass(frozen=True)
class PrefillCandidate:
    uncached_tokens: float  # utok(p)
    requests: int  # req(p)
    output_length: int  # OL(p)


@dataclass(frozen=True)
class Decision:
    prefill: bool
    case: Case
    delta: float | None = None


def classify(m_plus: tuple, m_minus: tuple) -> Case:
    """Compare the (Prio, arrival, id) keys; equal keys mean the same relQuery."""
    if m_plus > m_minus:
        return Case.PREEMPT
    if m_plus == m_minus:
        return Case.INTERNAL
    return Case.TRANSITIONAL


def delta(
    candidate: PrefillCandidate,
    running_output_lengths: Sequence[int],
    waiting_relqueries: int,
    cost: CostModel,
) -> float:
    """Δ = Δ+ + Δ-: the change in summed latency if p runs before d."""
    running_relqueries = len(running_output_lengths)
    increase = cost.prefill_time(candidate.uncached_tokens) * running_relqueries + sum(
        cost.alpha_d * candidate.requests * min(ol, candidate.output_length)
        for ol in running_output_lengths
    )
    longest_running = max(running_output_lengths, default=0)
    reduction = waiting_relqueries * cost.beta_d * min(candidate.output_length, longest_running)
    return increase - reduction


def arrange(
    m_plus: tuple,
    m_minus: tuple,
    candidate: PrefillCandidate,
    running_output_lengths: Sequence[int],
    waiting_relqueries: int,
    cost: CostModel,
    arrangement: Arrangement = Arrangement.ADAPTIVE,
) -> Decision:
    """Choose between two non-empty candidates."""
    case = classify(m_plus, m_minus)
    if case is not Case.TRANSITIONAL:
        return Decision(prefill=True, case=case)
    if arrangement is Arrangement.PREFILL_FIRST:
        return Decision(prefill=True, case=case)
    if arrangement is Arrangement.DECODE_FIRST:
        return Decision(prefill=False, case=case)
    change = delta(candidate, running_output_lengths, waiting_relqueries, cost)
    return Decision(prefill=change < 0, case=case, delta=change)
