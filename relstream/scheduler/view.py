"""What a policy sees of an engine: the `EngineView` contract (clock, tracked requests,
limits, prefix cache, KV) that vLLM's plug-in and the simulator each implement. The plain
data it carries is in `data.py`; the request state in a `RequestTracker` (`tracker.py`)
that the engine updates incrementally on arrival, step and finish, so a scheduling
decision never rebuilds a snapshot of tens of thousands of waiting requests. The data is
imported from `data.py` alone, the view from here."""

from __future__ import annotations

from abc import ABC, abstractmethod

from relstream.scheduler.data import EngineLimits, SeqInfo
from relstream.scheduler.tracker import RequestTracker


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
