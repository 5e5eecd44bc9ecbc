"""What a policy sees of an engine (EngineView) and what it answers (StepPlan).

The request state lives in a RequestTracker that the engine updates incrementally on
arrival, step and finish, so a scheduling decision never has to rebuild a snapshot of
tens of thousands of waiting requests.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from dataclasses import dataclass, field
from enum import Enum


@dataclass(eq=False)
class SeqInfo:
    """One request as the scheduler sees it."""

    request_id: str
    relquery_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_time: float
    computed_tokens: int = 0
    output_tokens: int = 0

    @property
    def prefill_done(self) -> bool:
        """Decoding: every token but the last sampled one has its KV (vLLM's invariant)."""
        return self.output_tokens >= 1 and self.uncomputed_tokens <= 1

    @property
    def uncomputed_tokens(self) -> int:
        """Tokens without KV; after a preemption that is the prompt plus all output so far."""
        return self.prompt_tokens + self.output_tokens - self.computed_tokens

    @property
    def remaining_output(self) -> int:
        return max(self.max_tokens - self.output_tokens, 0)


@dataclass(eq=False)
class RelQueryInfo:
    """Per-relQuery aggregates kept current by the tracker."""

    relquery_id: str
    arrival_time: float
    total_requests: int  # req(R_0): the size the relQuery was submitted with
    max_tokens: int  # OL(R)
    waiting: OrderedDict[str, SeqInfo] = field(default_factory=OrderedDict)
    running: dict[str, SeqInfo] = field(default_factory=dict)
    finished: int = 0
    prompt_tokens_seen: int = 0


@dataclass(frozen=True)
class EngineLimits:
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_capacity_tokens: int  # `cap` of Algorithm 1
    block_size: int


class RequestTracker:
    """Waiting/running requests grouped by relQuery, updated by the engine."""

    def __init__(self) -> None:
        self.waiting: OrderedDict[str, SeqInfo] = OrderedDict()  # global arrival order
        self.running: dict[str, SeqInfo] = {}  # admission order
        self.relqueries: dict[str, RelQueryInfo] = {}
        self.active_relqueries: dict[str, RelQueryInfo] = {}  # those with running requests
        self._changed: set[str] = set()

    def add_request(self, seq: SeqInfo, relquery_size: int) -> RelQueryInfo:
        info = self.relqueries.get(seq.relquery_id)
        if info is None:
            info = RelQueryInfo(seq.relquery_id, seq.arrival_time, relquery_size, seq.max_tokens)
            self.relqueries[seq.relquery_id] = info
        info.waiting[seq.request_id] = seq
        info.prompt_tokens_seen += seq.prompt_tokens
        self.waiting[seq.request_id] = seq
        self._changed.add(seq.relquery_id)
        return info

    def start(self, request_id: str) -> SeqInfo:
        """Move a request from waiting to running (its first prefill was scheduled)."""
        seq = self.waiting.pop(request_id)
        info = self.relqueries[seq.relquery_id]
        del info.waiting[request_id]
        info.running[request_id] = seq
        self.running[request_id] = seq
        self.active_relqueries[seq.relquery_id] = info
        self._changed.add(seq.relquery_id)
        return seq

    def requeue(self, request_id: str) -> SeqInfo:
        """A running request was preempted by recompute: its KV is gone, it waits again at
        the front and will prefill its prompt and output so far."""
        seq = self.running.pop(request_id)
        seq.computed_tokens = 0
        info = self.relqueries[seq.relquery_id]
        del info.running[request_id]
        info.waiting[request_id] = seq
        info.waiting.move_to_end(request_id, last=False)
        self.waiting[request_id] = seq
        self.waiting.move_to_end(request_id, last=False)
        self._deactivate_if_idle(info)
        self._changed.add(seq.relquery_id)
        return seq

    def record_progress(self, seq: SeqInfo, computed: int = 0, generated: int = 0) -> None:
        seq.computed_tokens += computed
        seq.output_tokens += generated
        self._changed.add(seq.relquery_id)

    def finish(self, request_id: str) -> RelQueryInfo | None:
        """Drop a finished request; returns its relQuery when that was its last one."""
        seq = self.running.pop(request_id, None) or self.waiting.pop(request_id)
        info = self.relqueries[seq.relquery_id]
        info.running.pop(request_id, None)
        info.waiting.pop(request_id, None)
        info.finished += 1
        self._deactivate_if_idle(info)
        self._changed.add(seq.relquery_id)
        if info.waiting or info.running:
            return None
        del self.relqueries[seq.relquery_id]
        return info

    def drain_changed(self) -> set[str]:
        changed, self._changed = self._changed, set()
        return {rq for rq in changed if rq in self.relqueries}

    def _deactivate_if_idle(self, info: RelQueryInfo) -> None:
        if not info.running:
            self.active_relqueries.pop(info.relquery_id, None)


class EngineView(ABC):
    """The engine as a policy sees it: tracked requests, limits, clock, prefix cache."""

    tracker: RequestTracker
    limits: EngineLimits

    @abstractmethod
    def now(self) -> float: ...

    @abstractmethod
    def cached_prompt_tokens(self, seq: SeqInfo) -> int:
        """Prompt tokens of `seq` already in the prefix cache; must not change the cache."""

    @abstractmethod
    def free_kv_tokens(self) -> int: ...

    def admission_kv_tokens(self, seq: SeqInfo, cached_tokens: int) -> int:
        """KV tokens a request needs to start: blocks for its uncomputed tokens, less the
        cached ones. Like vLLM, output blocks are taken as decoding goes."""
        block = self.limits.block_size
        total_blocks = -(-seq.uncomputed_tokens // block)
        return (total_blocks - cached_tokens // block) * block

    def growth_kv_tokens(self, seq: SeqInfo, new_tokens: int) -> int:
        """KV tokens a running request must newly take to compute `new_tokens` more
        (whole blocks). This default assumes it holds exactly the blocks of its computed
        tokens; engines that know better override it."""
        block = self.limits.block_size
        held = -(-seq.computed_tokens // block)
        return max(-(-(seq.computed_tokens + new_tokens) // block) - held, 0) * block

    def releasable_kv_tokens(self, seq: SeqInfo) -> int:
        """KV tokens that evicting a running request gives back (an upper bound here:
        engines that know which blocks are shared override it)."""
        block = self.limits.block_size
        return -(-(seq.computed_tokens + 1) // block) * block


class StepKind(Enum):
    IDLE = "idle"
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"

    @classmethod
    def of(cls, prefills: bool, decodes: bool) -> StepKind:
        """The kind of a step that computes prompt tokens and/or decodes."""
        if prefills and decodes:
            return cls.MIXED
        if prefills:
            return cls.PREFILL
        return cls.DECODE if decodes else cls.IDLE


@dataclass(frozen=True)
class PrefillChunk:
    request_id: str
    num_tokens: int  # prompt tokens to compute this step (uncached, possibly a chunk)


@dataclass(frozen=True)
class StepPlan:
    prefill: tuple[PrefillChunk, ...] = ()
    decode: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()  # running requests to evict (recompute) before the step

    @property
    def kind(self) -> StepKind:
        return StepKind.of(bool(self.prefill), bool(self.decode))


IDLE = StepPlan()


@dataclass(frozen=True)
class StepFeedback:
    """A step as executed, fed back to the cost model's online fit."""

    kind: StepKind
    uncached_tokens: int
    decode_requests: int
    duration: float
