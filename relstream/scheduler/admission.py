"""One admission for every policy: what a step runs and whom it admits, within the
engine's limits, and why it stopped.

A policy decides *order* (which running request is worth more, which waiting one comes
next) and, for relstream, which relQueries a step offers and a `limit` on their prompt
tokens (the Δ gate, `gate.gated_fill`, which decides whether to call `admit` at all);
`StepAdmission` alone decides *how much fits*, the same way for every policy, so no
policy can take fewer requests into a step than its order allows:

1. Running requests, one of two ways:
   - `run_running` (V1's batches): in the policy's order while the token budget lasts,
     a decode taking one token and an unfinished prompt the rest of it, cut to the
     budget left and to vLLM's `long_prefill_token_threshold` (`tracker.prefill_cap`).
     (vLLM V1's `schedule()`, step 1).
   - `decode` then `continue_prompts` (relstream's gated steps, `gate.gated_fill`):
     every running request decodes first, then unfinished prompts continue in rank
     order, each under the gate's `limit` on its prompt tokens.
   Either way one rule preempts: a request whose next tokens find no free KV preempts
   others by recompute until they fit, the policy's `victim` among the running requests
   in its order first (the last, unless the policy says otherwise: V1's priority queue),
   and `_evict` gives back what the victim held.
2. `admit`: waiting requests in the policy's order while seats (`max_num_seqs`), token
   budget, KV and a `limit` on prompt tokens last; a request is taken only if its whole
   current sequence fits after its prefix-cache hit, and the first one that does not
   ends admission, so a later request never overtakes an earlier one. Nobody is
   admitted in a step that preempted (V1).

With `reserve` > 0 (relstream) KV is kept for each request's prompt rest and expected
output, times `reserve` (`future_kv`), so as not to admit what it would soon preempt (V1: 0).

`Stop` says why admission ended (SGLang's `PrefillAdder` answers the same question).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

from relstream.scheduler.data import IDLE, PrefillChunk, RelQueryInfo, SeqInfo, StepPlan
from relstream.scheduler.remaining import Oracle, expected_output, row_remaining_output
from relstream.scheduler.tracker import prefill_cap
from relstream.scheduler.view import EngineView

Victim = Callable[[list[SeqInfo]], SeqInfo]  # the running request to evict first


class Stop(Enum):
    """Why admission ended."""

    DRAINED = "drained"  # every candidate was taken
    SEATS = "seats"  # the running set is at max_num_seqs
    BUDGET = "budget"  # the step's token budget is spent
    KV = "kv"  # the next request's sequence does not fit in the free KV (less reserved)
    PREEMPTED = "preempted"  # the step preempted: V1 admits nobody then
    LIMIT = "limit"  # the next prompt exceeds the caller's limit (relstream's gate)


class Chunking(Enum):
    """How a prompt longer than the budget left is treated."""

    CUT = "cut"  # vLLM V1, Sarathi: in chunks, cut to what is left (and to `cap`)
    WHOLE = "whole"  # vLLM V0: whole prompts only; one longer than the budget runs alone


def victim_last(running: list[SeqInfo]) -> SeqInfo:
    """vLLM V1's FCFS victim: the request admitted last (or ranked last)."""
    return running[-1]


def future_kv(total: int, held: int, block: int, share: float) -> int:
    """KV a request will still take, times `share`: the blocks its `total` tokens fill
    beyond those its `held` tokens fill."""
    return int((-(-total // block) - -(-held // block)) * block * share)


@dataclass
class StepAdmission:
    """One step being composed: budget, seats and KV left, and what it will run."""

    view: EngineView
    budget: int
    free_kv: int
    seats: int
    chunking: Chunking = Chunking.CUT
    cap: int | None = None  # the most tokens one request computes this step (None: any)
    reserve: float = 0.0  # share of running requests' future KV kept back
    oracle: Oracle | None = None  # true remaining outputs (the lab's clairvoyant)
    scheduled: dict[str, int] = field(default_factory=dict)  # running id -> tokens this step
    unscheduled: set[str] = field(default_factory=set)  # decodes whose token is taken
    growth: dict[str, int] = field(default_factory=dict)  # running id -> KV its tokens take
    preempted: list[SeqInfo] = field(default_factory=list)
    admitted: list[PrefillChunk] = field(default_factory=list)
    stop: Stop | None = None  # why the last `admit` ended
    reserved: int = 0  # KV kept for running requests' future tokens, summed
    reserving: dict[str, int] = field(default_factory=dict)  # request id -> its share
    expected: dict[str, int] = field(default_factory=dict)  # relQuery id -> output a row
    order: list[SeqInfo] = field(default_factory=list)  # running, the policy's order
    victim: Victim = victim_last  # whom of `order` a KV shortfall preempts first

    @classmethod
    def for_step(
        cls,
        view: EngineView,
        chunking: Chunking = Chunking.CUT,
        budget: int | None = None,
        free_kv: int | None = None,
        seats: int | None = None,
        reserve: float = 0.0,
        oracle: Oracle | None = None,
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
            reserve,
            oracle,
        )

    # running requests: V1's way (`run_running`), relstream's gated way (`decode`)
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
        self.order, self.victim = list(running), victim
        self.seats = self.view.limits.max_num_seqs - len(self.order)
        index = 0
        while index < len(self.order) and self.budget > 0:
            seq = self.order[index]
            if not seq.remaining_output:  # every token in flight (async scheduling)
                index += 1
                continue
            tokens = self._chunk(min(seq.uncomputed_tokens, self.budget))
            need = self.view.growth_kv_tokens(seq, tokens)
            preempted_itself = False
            while need > self.free_kv and not preempted_itself:
                at, evicted = self._preempt_one()
                index -= at < index
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

    def decode(self, active: list[RelQueryInfo], idle: list[SeqInfo] = ()) -> None:
        """Decode every running request of `active` (relQueries best first; each decode
        takes one token of the budget first), in rank order; on a KV shortfall preempt
        the worst-ranked (`idle`: running requests not run this step, ranked after them).
        Keep KV for what every running request will still take (`reserve`)."""
        self.order = [seq for info in active for seq in info.running.values()] + list(idle)
        self.expected = {info.relquery_id: expected_output(info) for info in active}
        decoding: list[SeqInfo] = []
        for info in active:
            # Prompts still running keep their KV whether or not they continue this
            # step; a decode's share is set when it is scheduled just below. A request
            # whose every output token is already in flight (async scheduling) keeps its
            # seat and runs nothing this step, as in vLLM's AsyncScheduler.
            prompting = info.prompting
            for seq in prompting.values():
                self.reserving[seq.request_id] = self._later(seq, 0)
            decoding.extend(
                seq
                for request_id, seq in info.running.items()
                if seq.max_tokens > seq.output_tokens and request_id not in prompting
            )
        self.budget -= len(decoding)  # each decode's token taken now, scheduled below
        self.reserved = sum(self.reserving.values())
        if self.oracle is None and type(self.view).growth_kv_tokens is EngineView.growth_kv_tokens:
            done = self._decode_unpreempted(decoding)
            if done == len(decoding):
                return
            decoding = decoding[done:]
        self.unscheduled = {seq.request_id for seq in decoding}
        for seq in decoding:
            if self.preempted and seq in self.preempted:
                continue
            need = self.view.growth_kv_tokens(seq, 1)
            if need > self.free_kv and not self._make_room(seq, need):
                break
            self._decode_one(seq, need, self._later(seq, 1))

    def _decode_one(self, seq: SeqInfo, need: int, later: int) -> None:
        """`_schedule(seq, 1)` of a decode, which holds no share of `reserved` yet."""
        self.free_kv -= need
        self.reserved += later
        self.reserving[seq.request_id] = later
        self.scheduled[seq.request_id] = 1
        self.growth[seq.request_id] = need

    def _decode_unpreempted(self, decoding: list[SeqInfo]) -> int:
        """`decode`'s loop while every row fits the free KV, with `_later` and the view's
        own `growth_kv_tokens(seq, 1)` inlined and the step's books written once at the
        end (this runs for every running row, each step); the rows scheduled, the first
        that needs room being where `decode` goes on one by one."""
        block, reserve, expected = self.view.limits.block_size, self.reserve, self.expected
        free, reserved, scheduled, laters = self.free_kv, 0, [], []
        for seq in decoding:
            computed = seq.computed_tokens
            need = 0 if computed % block else block
            if need > free:
                break
            free -= need
            if need:
                self.growth[seq.request_id] = need
            generated, cap = seq.output_tokens, expected[seq.relquery_id]
            if seq.max_tokens < cap:
                cap = seq.max_tokens
            left = cap - generated if cap - generated > 1 else 1
            later = future_kv(seq.prompt_tokens + generated + left, computed + 1, block, reserve)
            reserved += later
            scheduled.append(seq.request_id)
            laters.append(later)
        self.free_kv = free
        self.reserved += reserved
        self.scheduled.update(dict.fromkeys(scheduled, 1))
        self.reserving.update(zip(scheduled, laters, strict=True))
        return len(scheduled)

    def continue_prompts(self, info: RelQueryInfo, limit: int | None = None) -> None:
        """Continue R's unfinished running prompts, chunked to the budget left. vLLM gives
        a running prompt all the budget it can, so a prompt goes only where it fits whole
        when the step must not give it that much: under a `limit` on R's prompt tokens,
        and once this step admitted a better-ranked relQuery (vLLM computes running
        prompts before it admits anyone). Otherwise it waits a step. "All" and "whole"
        stop at the long-prefill cap, as vLLM's own chunk does."""
        allowed = self.budget if limit is None else min(limit, self.budget)
        whole_only = limit is not None or bool(self.admitted)
        for seq in list(info.prompting.values()):
            if self.preempted and seq in self.preempted:
                continue
            chunk = self._chunk(seq.uncomputed_tokens)
            tokens = min(chunk, allowed)
            if whole_only and tokens < chunk:
                continue
            if tokens <= 0 or not self._schedule(seq, tokens):
                return
            self.budget -= tokens
            allowed -= tokens

    def _chunk(self, tokens: int) -> int:
        """What vLLM computes of a request's `tokens` left, budget permitting."""
        return tokens if self.cap is None else min(tokens, self.cap)

    def _later(self, seq: SeqInfo, tokens: int) -> int:
        """KV `seq` will still take after this step's `tokens`: its prompt's rest and its
        expected output, scaled by the reserve share."""
        left = row_remaining_output(seq, self.expected[seq.relquery_id], self.oracle)
        total = seq.prompt_tokens + seq.output_tokens + left  # computed + uncomputed + left
        block = self.view.limits.block_size
        return future_kv(total, seq.computed_tokens + tokens, block, self.reserve)

    def _schedule(self, seq: SeqInfo, tokens: int) -> bool:
        need = self.view.growth_kv_tokens(seq, tokens)
        if need > self.free_kv and not self._make_room(seq, need):
            return False
        self.free_kv -= need
        self.reserved -= self.reserving.pop(seq.request_id, 0)
        later = self._later(seq, tokens)
        self.reserving[seq.request_id] = later
        self.reserved += later
        self.scheduled[seq.request_id] = tokens
        self.growth[seq.request_id] = need
        return True

    def _make_room(self, seq: SeqInfo, need: int) -> bool:
        """Preempt victims until `need` KV is free; False if `seq` went."""
        while need > self.free_kv:
            if self._preempt_one()[1] is seq:
                return False
        return True

    def last_victim(self) -> SeqInfo | None:
        """Whom `preempt_last` would preempt (None: nobody runs)."""
        return self.victim(self.order) if self.order else None

    def preempt_last(self) -> SeqInfo:
        return self._preempt_one()[1]

    def _preempt_one(self) -> tuple[int, SeqInfo]:
        """The policy's victim among the running requests preempted; where it stood."""
        victim = self.victim(self.order)
        at = len(self.order) - 1 if victim is self.order[-1] else self.order.index(victim)
        del self.order[at]
        self._evict(victim)
        return at, victim

    def _evict(self, victim: SeqInfo) -> None:
        """`victim` preempted by recompute: its seat, its KV (held and grown this step),
        its reserve and the budget it took this step (its scheduled tokens, or a decode's
        token taken before it was scheduled), given back."""
        request_id = victim.request_id
        self.preempted.append(victim)
        self.seats += 1
        self.free_kv += self.view.releasable_kv_tokens(victim) + self.growth.pop(request_id, 0)
        self.reserved -= self.reserving.pop(request_id, 0)
        tokens = self.scheduled.pop(request_id, None)
        self.budget += tokens if tokens is not None else int(request_id in self.unscheduled)

    # waiting requests, every policy's way
    def admit(self, candidates: Iterable[SeqInfo], limit: int | None = None) -> Stop:
        """Admit `candidates` in order while seats, budget, KV (less what is reserved)
        and a `limit` on their prompt tokens (whole prompts, or whole chunks at the
        long-prefill cap) last; why it stopped."""
        self.stop = self._admit(candidates, limit)
        return self.stop

    def admission_need(self, seq: SeqInfo) -> int:
        """KV a waiting row takes to start, and what is kept for it beside (`admit`)."""
        cached = self.view.cached_prompt_tokens(seq)
        return self.view.admission_kv_tokens(seq, cached) + self._kept_for(seq)

    def _kept_for(self, seq: SeqInfo) -> int:
        """The reserve's share of the KV a waiting row will take after its prompt."""
        if not self.reserve:
            return 0
        total = seq.uncomputed_tokens + row_remaining_output(seq, self._expected(seq), self.oracle)
        return future_kv(total, seq.uncomputed_tokens, self.view.limits.block_size, self.reserve)

    def _watermark(self) -> int:
        """vLLM's watermark, kept once any request runs (planned or not) or was admitted."""
        running = len(self.view.tracker.running) > len(self.preempted)
        return self.view.limits.watermark_kv_tokens if running or self.admitted else 0

    def _admit(self, candidates: Iterable[SeqInfo], limit: int | None) -> Stop:
        if self.preempted:
            return Stop.PREEMPTED
        view, allowed = self.view, limit
        for seq in candidates:
            if self.budget <= 0:
                return Stop.BUDGET
            if self.seats <= 0:
                return Stop.SEATS
            cached = view.cached_prompt_tokens(seq)
            tokens = seq.uncomputed_tokens - cached
            if self.chunking is Chunking.CUT:
                tokens = self._chunk(tokens)
            if allowed is not None:
                if tokens > min(allowed, self.budget):
                    return Stop.LIMIT
                allowed -= tokens
            need = view.admission_kv_tokens(seq, cached)
            later = self._kept_for(seq)
            if need + later + self._watermark() > self.free_kv - self.reserved:
                return Stop.KV
            if tokens > self.budget:
                if self.chunking is Chunking.CUT:
                    tokens = self.budget
                elif self.admitted:
                    return Stop.BUDGET
            self.admitted.append(PrefillChunk(seq.request_id, tokens))
            self.free_kv -= need
            self.reserved += later
            self.budget -= tokens
            self.seats -= 1
        return Stop.DRAINED

    def _expected(self, seq: SeqInfo) -> int:
        relquery_id = seq.relquery_id
        expected = self.expected.get(relquery_id)
        if expected is None:
            info = self.view.tracker.relqueries[relquery_id]
            expected = self.expected[relquery_id] = expected_output(info)
        return expected

    def plan(self) -> StepPlan:
        """The step: running prompts' chunks and admissions, decodes, evictions."""
        prompting = self.view.tracker.prompting
        chunks = [
            PrefillChunk(request_id, tokens)
            for request_id, tokens in self.scheduled.items()
            if request_id in prompting
        ]
        decode = tuple(rid for rid in self.scheduled if rid not in prompting)
        plan = StepPlan(
            prefill=(*chunks, *self.admitted),
            decode=decode,
            preempt=tuple(seq.request_id for seq in self.preempted),
        )
        return plan if plan.prefill or plan.decode or plan.preempt else IDLE
