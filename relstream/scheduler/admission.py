"""One admission for every policy: what a step runs and whom it admits, within the
engine's limits, and why it stopped.

A policy decides *order* (which running request is worth more, which waiting one comes
next); `StepAdmission` alone decides *how much fits*, the same way for every policy, so
no policy can take fewer requests into a step than its order allows:

1. `run_running`: running requests in the policy's order while the token budget lasts,
   a decode taking one token and an unfinished prompt the rest of it, cut to the budget
   left and to vLLM's `long_prefill_token_threshold` (`tracker.prefill_cap`). A request
   whose next tokens find no free KV preempts others by recompute, the policy's
   `victim` first, until they fit (vLLM V1's `schedule()`, step 1).
2. `admit`: waiting requests in the policy's order while seats (`max_num_seqs`), token
   budget and KV last; a request is taken only if its whole current sequence fits after
   its prefix-cache hit, and the first one that does not fit ends admission, so a later
   request never overtakes an earlier one. V1 admits nobody in a step that preempted.

`Stop` says why admission ended (SGLang's `PrefillAdder` answers the same question).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from relstream.scheduler.tracker import prefill_cap
from relstream.scheduler.view import IDLE, EngineView, PrefillChunk, SeqInfo, StepPlan

Victim = Callable[[list[SeqInfo]], SeqInfo]  # the running request to evict first


class Stop(Enum):
    """Why admission ended."""

    DRAINED = "drained"  # every candidate was taken
    SEATS = "seats"  # the running set is at max_num_seqs
    BUDGET = "budget"  # the step's token budget is spent
    KV = "kv"  # the next request's sequence does not fit in the free KV
    PREEMPTED = "preempted"  # the step preempted: V1 admits nobody then


class Chunking(Enum):
    """How a prompt longer than the budget left is treated."""

    CUT = "cut"  # vLLM V1, Sarathi: in chunks, cut to what is left (and to `cap`)
    WHOLE = "whole"  # vLLM V0: whole prompts only; one longer than the budget runs alone


def victim_last(running: list[SeqInfo]) -> SeqInfo:
    """vLLM V1's FCFS victim: the request admitted last (or ranked last)."""
    return running[-1]


@dataclass
class StepAdmission:
    """One step being composed: budget, seats and KV left, and what it will run."""

    view: EngineView
    budget: int
    free_kv: int
    seats: int
    chunking: Chunking = Chunking.CUT
    cap: int | None = None  # the most tokens one request computes this step (None: any)
    scheduled: dict[str, int] = field(default_factory=dict)  # running id -> tokens this step
    growth: dict[str, int] = field(default_factory=dict)  # running id -> KV its tokens take
    preempted: list[SeqInfo] = field(default_factory=list)
    admitted: list[PrefillChunk] = field(default_factory=list)

    @classmethod
    def for_step(
        cls,
        view: EngineView,
        chunking: Chunking = Chunking.CUT,
        budget: int | None = None,
        free_kv: int | None = None,
        seats: int | None = None,
    ) -> StepAdmission:
        """The engine's whole budget, free KV and free seats, unless given."""
        limits = view.limits
        return cls(
            view,
            limits.max_num_batched_tokens if budget is None else budget,
            view.free_kv_tokens() if free_kv is None else free_kv,
            limits.max_num_seqs - len(view.tracker.running) if seats is None else seats,
            chunking,
            prefill_cap(limits, view.tracker),
        )

    def run_running(
        self,
        running: list[SeqInfo],
        victim: Victim = victim_last,
        self_preemption_ends_pass: bool = True,
    ) -> None:
        """Give the budget to `running` in order; preempt `victim(...)` while a request's
        next tokens lack KV. A victim already scheduled gives back its tokens and KV; if
        the victim is the request itself, the pass ends there (vLLM 0.32), or goes on to
        the requests after it, which may fit in what it freed (0.33). A request whose
        every output token is already in flight (async scheduling) keeps its seat and
        runs nothing, as in vLLM's AsyncScheduler."""
        running = list(running)
        self.seats = self.view.limits.max_num_seqs - len(running)
        index = 0
        while index < len(running) and self.budget > 0:
            seq = running[index]
            if not seq.remaining_output:  # every token in flight (async scheduling)
                index += 1
                continue
            tokens = min(seq.uncomputed_tokens, self.budget)
            if self.cap is not None:
                tokens = min(tokens, self.cap)
            need = self.view.growth_kv_tokens(seq, tokens)
            preempted_itself = False
            while need > self.free_kv and not preempted_itself:
                evicted = victim(running)
                if running.index(evicted) < index:
                    index -= 1
                running.remove(evicted)
                self._release(evicted)
                preempted_itself = evicted is seq
            if preempted_itself:
                if self_preemption_ends_pass:
                    return
                continue  # `index` already points at the request after it
            self.free_kv -= need
            self.budget -= tokens
            self.scheduled[seq.request_id] = tokens
            self.growth[seq.request_id] = need
            index += 1

    def _release(self, seq: SeqInfo) -> None:
        self.preempted.append(seq)
        self.seats += 1
        self.free_kv += self.view.releasable_kv_tokens(seq) + self.growth.pop(seq.request_id, 0)
        self.budget += self.scheduled.pop(seq.request_id, 0)

    def admit(self, candidates: Iterable[SeqInfo]) -> Stop:
        """Admit `candidates` in order while seats, budget and KV last; why it stopped."""
        if self.preempted:
            return Stop.PREEMPTED
        for seq in candidates:
            if self.budget <= 0:
                return Stop.BUDGET
            if self.seats <= 0:
                return Stop.SEATS
            cached = self.view.cached_prompt_tokens(seq)
            need = self.view.admission_kv_tokens(seq, cached)
            if need > self.free_kv:
                return Stop.KV
            tokens = seq.uncomputed_tokens - cached
            if self.chunking is Chunking.CUT and self.cap is not None:
                tokens = min(tokens, self.cap)
            if tokens > self.budget:
                if self.chunking is Chunking.CUT:
                    tokens = self.budget
                elif self.admitted:
                    return Stop.BUDGET
            self.admitted.append(PrefillChunk(seq.request_id, tokens))
            self.free_kv -= need
            self.budget -= tokens
            self.seats -= 1
        return Stop.DRAINED

    def plan(self) -> StepPlan:
        """The step: running prompts' chunks and admissions, decodes, evictions."""
        running = self.view.tracker.running
        chunks = [
            PrefillChunk(request_id, tokens)
            for request_id, tokens in self.scheduled.items()
            if not running[request_id].prefill_done
        ]
        decode = tuple(rid for rid in self.scheduled if running[rid].prefill_done)
        plan = StepPlan(
            prefill=(*chunks, *self.admitted),
            decode=decode,
            preempt=tuple(seq.request_id for seq in self.preempted),
        )
        return plan if plan.prefill or plan.decode or plan.preempt else IDLE
