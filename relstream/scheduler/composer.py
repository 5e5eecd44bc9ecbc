"""One step of relstream's policy being composed: the token budget, seats and KV left,
what runs and what is admitted, and the KV kept for what running requests will still
take. The composer never decides order; relstream hands it relQueries best first."""

from __future__ import annotations

from relstream.scheduler.remaining import Oracle, expected_output, row_remaining_output
from relstream.scheduler.tracker import prefill_cap
from relstream.scheduler.view import IDLE, EngineView, PrefillChunk, RelQueryInfo, SeqInfo, StepPlan


class StepComposer:
    """One step being composed: budget, seats and KV left, and what it will run."""

    def __init__(self, view: EngineView, oracle: Oracle | None, reserve: float) -> None:
        self.view = view
        self.oracle = oracle
        self.reserve = reserve
        self.block = view.limits.block_size
        self.budget = view.limits.max_num_batched_tokens
        # the most tokens one request computes this step: vLLM's long-prefill threshold
        self.cap = prefill_cap(view.limits, view.tracker)
        self.seats = view.limits.max_num_seqs - len(view.tracker.running)
        self.free = view.free_kv_tokens()
        self.reserved = 0  # KV the running requests will still take, summed
        self.reserving: dict[str, int] = {}  # request id -> its share of `reserved`
        self.rows: list[SeqInfo] = []  # running rows, best-ranked first
        self.expected: dict[str, int] = {}  # relQuery id -> expected output per row
        # request id -> (tokens, KV taken, whether it decodes) of running requests
        self.scheduled: dict[str, tuple[int, int, bool]] = {}
        self.prefill: list[PrefillChunk] = []  # admitted rows' first chunks
        self.preempted: list[str] = []

    def decode(self, active: list[RelQueryInfo]) -> None:
        """Decode every running request (each takes one token of the budget first), in
        rank order; on a KV shortfall preempt the worst-ranked relQuery's last row. Keep KV
        for what every running request will still take: its prompt's rest and its
        expected output."""
        self.rows = [seq for info in active for seq in info.running.values()]
        self.expected = {info.relquery_id: expected_output(info) for info in active}
        decoding = []
        for seq in self.rows:
            generated = seq.output_tokens  # `prefill_done`, inlined as below
            if generated >= 1 and seq.prompt_tokens + generated - seq.computed_tokens <= 1:
                # A request whose every output token is already in flight (async
                # scheduling) keeps its seat and runs nothing this step, as in vLLM's
                # AsyncScheduler.
                if seq.max_tokens > generated:  # `remaining_output`
                    decoding.append(seq)
            else:
                # Prompts still running keep their KV whether or not they continue this
                # step; a decode's share is set when it is scheduled just below.
                self.reserving[seq.request_id] = self._later(seq, 0)
        self.budget -= len(decoding)
        self.reserved = sum(self.reserving.values())
        # `_schedule(seq, 1)` for each, its steps and `_later`'s inlined: this runs for
        # every running row, each step (a decoding row holds no share of `reserved` yet)
        growth, later_kv = self.view.growth_kv_tokens, self._later
        block, reserve, expected, oracle = self.block, self.reserve, self.expected, self.oracle
        exact_blocks = type(self.view).growth_kv_tokens is EngineView.growth_kv_tokens
        reserving, scheduled, preempted = self.reserving, self.scheduled, self.preempted
        for seq in decoding:
            request_id = seq.request_id
            if preempted and request_id in preempted:
                continue
            # the view's own growth_kv_tokens(seq, 1) inlined; an engine's override called
            exact = 0 if seq.computed_tokens % block else block
            need = exact if exact_blocks else growth(seq, 1)
            if need > self.free and not self._make_room(seq, need):
                break
            self.free -= need
            if oracle is None:
                generated = seq.output_tokens
                left = max(1, min(seq.max_tokens, expected[seq.relquery_id]) - generated)
                total = seq.prompt_tokens + generated + left
                blocks = -(-total // block) - -(-(seq.computed_tokens + 1) // block)
                later = int(blocks * block * reserve)
            else:
                later = later_kv(seq, 1)
            self.reserved += later
            reserving[request_id] = later
            scheduled[request_id] = (1, need, True)  # decoding: its prompt is done

    def continue_prompts(self, info: RelQueryInfo, limit: int | None = None) -> None:
        """Continue R's unfinished running prompts, chunked to the budget left. vLLM gives
        a running prompt all the budget it can, so a prompt goes only where it fits whole
        when the step must not give it that much: under a `limit` on R's prompt tokens,
        and once this step admitted a better-ranked relQuery (vLLM computes running
        prompts before it admits anyone). Otherwise it waits a step. "All" and "whole"
        stop at the long-prefill cap, as vLLM's own chunk does."""
        allowed = self.budget if limit is None else min(limit, self.budget)
        whole_only = limit is not None or bool(self.prefill)
        for seq in list(info.running.values()):
            if seq.prefill_done or seq.request_id in self.preempted:
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
        block = self.block
        after = seq.computed_tokens + tokens
        total = seq.prompt_tokens + seq.output_tokens + left  # computed + uncomputed + left
        return int((-(-total // block) - -(-after // block)) * block * self.reserve)

    def _schedule(self, seq: SeqInfo, tokens: int) -> bool:
        need = self.view.growth_kv_tokens(seq, tokens)
        if need > self.free and not self._make_room(seq, need):
            return False
        self.free -= need
        self.reserved -= self.reserving.pop(seq.request_id, 0)
        later = self._later(seq, tokens)
        self.reserving[seq.request_id] = later
        self.reserved += later
        self.scheduled[seq.request_id] = (tokens, need, seq.prefill_done)
        return True

    def _make_room(self, seq: SeqInfo, need: int) -> bool:
        """Preempt from the end of the ranked rows until `need` KV is free; False when
        `seq` itself had to go."""
        while need > self.free:
            victim = self.rows.pop()
            self.preempted.append(victim.request_id)
            self.free += self.view.releasable_kv_tokens(victim)
            self.reserved -= self.reserving.pop(victim.request_id, 0)
            tokens, taken, _ = self.scheduled.pop(victim.request_id, (0, 0, False))
            self.free += taken
            self.budget += 1 if victim.prefill_done else tokens
            if victim is seq:
                return False
        return True

    def admit(self, info: RelQueryInfo, limit: int | None = None) -> bool:
        """Admit R's waiting rows while seats, budget, KV and a `limit` on their prompt
        tokens (whole prompts, or whole chunks at the long-prefill cap) last; False once
        one ran out."""
        block = self.view.limits.block_size
        expected = expected_output(info)
        allowed = limit
        for seq in list(info.waiting.values()):
            if self.seats <= 0 or self.budget <= 0:
                return False
            cached = self.view.cached_prompt_tokens(seq)
            chunk = self._chunk(seq.uncomputed_tokens - cached)
            if allowed is not None:
                if chunk > min(allowed, self.budget):
                    return False
                allowed -= chunk
            need = self.view.admission_kv_tokens(seq, cached)
            total = seq.uncomputed_tokens + row_remaining_output(seq, expected, self.oracle)
            growth = (-(-total // block) - -(-seq.uncomputed_tokens // block)) * block
            growth = int(growth * self.reserve)
            if need + growth > self.free - self.reserved:
                return False
            tokens = min(chunk, self.budget)
            self.prefill.append(PrefillChunk(seq.request_id, tokens))
            self.free -= need
            self.reserved += growth
            self.budget -= tokens
            self.seats -= 1
        return True

    def plan(self) -> StepPlan:
        scheduled = self.scheduled.items()
        decode = tuple(rid for rid, (_, _, decodes) in scheduled if decodes)
        chunks = tuple(
            PrefillChunk(rid, tokens) for rid, (tokens, _, decodes) in scheduled if not decodes
        )
        plan = StepPlan(
            prefill=chunks + tuple(self.prefill), decode=decode, preempt=tuple(self.preempted)
        )
        return plan if plan.prefill or plan.decode or plan.preempt else IDLE
