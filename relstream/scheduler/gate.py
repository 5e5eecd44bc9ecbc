"""The Δ gate: a step that holds relQueries back so the ones running finish sooner (the
paper's ABA, §4.3, in V1's chunked, mixed steps).

relstream uses it only while the stream leaves capacity to spare (`headroom`): smaller
batches share each step's base among fewer requests. Within a gated step, in rank order
over started and waiting relQueries alike (`gated_fill`):

- a started relQuery's prompt chunk is capped where what it delays the relQueries
  decoding ahead of it outweighs the step base it saves (`prompt_allowance`);
- a waiting relQuery with less work left than every running one is admitted at once
  (shortest first: ABA's m+ > m-); any other only when Δ < 0 (`admission_pays`);
- once a relQuery is held back, nobody ranked after it is admitted.

KV is reserved for what running requests will still generate (`StepAdmission.reserve`),
so a gated engine does not admit what it would have to preempt.
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from relstream.scheduler.admission import StepAdmission, Stop
from relstream.scheduler.classes import Slowdown, lowest_running, outranks
from relstream.scheduler.data import RelQueryInfo, SeqInfo
from relstream.scheduler.remaining import Remaining
from relstream.scheduler.view import EngineView

Ranked = tuple[tuple, RelQueryInfo]  # (rank, relQuery), best rank first


class GateCoefficients(Protocol):
    base: float
    per_token: float
    per_decode: float

    def work(self, left: Remaining) -> float: ...


def sample(rows: Iterable[SeqInfo], size: int = 64) -> list[SeqInfo]:
    """The first `size` rows, without copying the rest (a queue may hold 100,000)."""
    return list(itertools.islice(rows, size))


def full_batch(view: EngineView) -> int:
    """Requests a batch holds when seats and KV are the only limits, from the mean
    sequence (prompt and output budget) of running or else waiting rows."""
    tracker = view.tracker
    seqs = sample(tracker.running.values()) or sample(tracker.waiting.values())
    if not seqs:
        return view.limits.max_num_seqs
    mean_tokens = sum(seq.prompt_tokens + seq.max_tokens for seq in seqs) / len(seqs)
    seats = view.limits.max_num_seqs
    return max(1, int(min(seats, view.limits.kv_capacity_tokens / max(mean_tokens, 1))))


def batching_is_free(view: EngineView, c: GateCoefficients) -> bool:
    """A full batch costs less per-request time than one step's base (a GPU reading its
    weights): every request added rides nearly free, so no prompt is capped."""
    return c.per_decode * full_batch(view) < c.base


def prompt_allowance(decoding_ahead: int, behind: float, c: GateCoefficients, free: bool):
    """Prompt tokens of a started relQuery that may join a step in which `decoding_ahead`
    better-ranked relQueries decode (None: no limit). Each token delays each of them by
    a_p; deferring the prompt costs a step's base b to it and the `behind` relQueries
    queued after it: the allowance is b·(1 + behind) / (a_p·k)."""
    if decoding_ahead == 0 or free or c.per_token <= 0:
        return None
    return int(c.base * (1 + behind) / (c.per_token * decoding_ahead))


class RunningSet:
    """The set S that `admission_pays` weighs a candidate against, with what it reads of S
    kept as relQueries join: sums of integers, the same as S summed afresh, so a step that
    weighs many candidates walks S's distinct L and (O, m), not S, for each."""

    def __init__(self, members: Iterable[Remaining] = ()) -> None:
        self.size = 0
        self.prompt_tokens = 0  # Σ P
        self.output_tokens = 0  # Σ O
        self.longest = 0  # max L
        self._steps: Counter[int] = Counter()  # L(R) -> relQueries of S
        self._outputs: Counter[tuple[int, int]] = Counter()  # (O(R), m(R)) -> relQueries
        for left in members:
            self.add(left)

    def add(self, left: Remaining) -> None:
        self.size += 1
        self.prompt_tokens += left.prompt_tokens
        self.output_tokens += left.output_tokens
        self.longest = max(self.longest, left.steps) if self.size > 1 else left.steps
        self._steps[left.steps] += 1
        self._outputs[left.output_tokens, left.rows] += 1

    def overlap(self, steps: int) -> int:
        """Σ_S min(steps, L(R))."""
        return sum(count * min(steps, own) for own, count in self._steps.items())

    def shared(self, steps: int) -> int:
        """Σ_S min(O(R), m(R)·steps)."""
        return sum(count * min(out, rows * steps) for (out, rows), count in self._outputs.items())


def admission_pays(
    running: RunningSet | Sequence[Remaining],
    candidate: Remaining,
    behind: float,
    c: GateCoefficients,
) -> bool:
    """Δ = Δ+ − Δ- < 0: admitting `candidate` now beats admitting it after the set S:

        Δ+ = |S|·a_p·P(p) + a_d·m(p)·Σ_S min(L(p), L(R))          delay it puts on S
        Δ- = T(S) − a_d·Σ_S min(O(R), m(R)·L(p))                   what p saves itself
             + behind·b·min(L(p), max L(S))                        saved steps, for the queue

    m: rows, L: decode steps left, O: output tokens left, T(S) = a_p·ΣP + b·max L + a_d·ΣO
    the time S still takes alone."""
    if not isinstance(running, RunningSet):
        running = RunningSet(running)
    if not running.size:
        return True
    longest = running.longest
    overlap = running.overlap(candidate.steps)
    increase = (
        running.size * c.per_token * candidate.prompt_tokens
        + c.per_decode * candidate.rows * overlap
    )
    alone = (
        c.per_token * running.prompt_tokens
        + c.base * longest
        + c.per_decode * running.output_tokens
    )
    shared = c.per_decode * running.shared(candidate.steps)
    reduction = alone - shared + behind * c.base * min(candidate.steps, longest)
    return increase - reduction < 0


def gated_fill(
    view: EngineView,
    step: StepAdmission,
    started: list[Ranked],
    waiting: Iterable[Ranked],
    queued: int,
    left: Callable[[str], Remaining],
    c: GateCoefficients,
    arriving: float = 0.0,
    slowdown: Slowdown | None = None,
) -> bool:
    """Give the step's prompt budget in rank order (`started`: running relQueries,
    `waiting`: fully waiting ones, each best first; `queued`: relQueries with waiting
    rows; `slowdown`: what lower classes may add beside a higher one, `classes`). True
    when the gate held work back (a capped prompt or a Δ ≥ 0)."""
    free = batching_is_free(view, c)
    lowest = lowest_running(started)  # a waiting relQuery of a class above it goes in
    started_lefts = [left(info.relquery_id) for _, info in started]
    best_running = min((c.work(remaining) for remaining in started_lefts), default=0.0)
    running_set = RunningSet(started_lefts)
    started_left = len(started)
    admitting, held = True, False
    decoding_ahead = 0  # relQueries ranked ahead whose rows decode in this step
    merged = heapq.merge(started, waiting, key=lambda pair: pair[0])
    lower = None  # prompt tokens lower classes may still take (`classes.Slowdown`)
    for position, (_, info) in enumerate(merged):
        behind = max(queued - position - 1, 0) + arriving
        limit = prompt_allowance(decoding_ahead, behind, c, free)
        cap = slowdown.prompt_limit(info, c.per_token) if slowdown is not None else None
        below = cap is not None
        if below:  # a lower class beside a higher one: what is left of the allowance
            lower = cap if lower is None else lower
            limit = lower if limit is None else min(limit, lower)
        if info.running:
            started_left -= 1
            before = step.budget
            step.continue_prompts(info, limit)
            decoding_ahead += len(info.running) > len(info.prompting)
            if below:
                lower -= before - step.budget
                limit = lower if limit is None else min(limit, lower)
        if not admitting or step.preempted:  # nobody else is admitted
            if started_left == 0:
                return held
            continue
        if not info.waiting:
            continue
        remaining = left(info.relquery_id)
        if below:
            before = step.budget
            admitting = step.admit(info.waiting.values(), limit) is Stop.DRAINED
            lower -= before - step.budget
        elif info.running:
            admitting = step.admit(info.waiting.values(), limit) is Stop.DRAINED
            held = held or (not admitting and limit is not None)
        elif c.work(remaining) < best_running or free or outranks(info, lowest):
            admitting = step.admit(info.waiting.values()) is Stop.DRAINED
        else:
            pays = admission_pays(running_set, remaining, behind, c)
            held = held or not pays
            admitting = pays and step.admit(info.waiting.values()) is Stop.DRAINED
        running_set.add(remaining)
    return held
