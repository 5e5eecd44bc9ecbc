"""Block-level KV cache with prefix caching, as the simulator's memory model.

Like vLLM's: a full block of prompt tokens is identified by a hash chained over all
tokens before it, so two prompts share a block only when their whole prefix matches.
Blocks no running request holds stay cached until evicted, least recently used first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hashes(token_ids: Sequence[int], block_size: int) -> tuple[int, ...]:
    """Chained hashes of each full block of `token_ids`."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return tuple(hashes)


@dataclass
class _Holding:
    hashed: list[int] = field(default_factory=list)  # cached blocks this request holds
    plain: int = 0  # private blocks (not yet, or never, in the prefix cache)


class PrefixCachedKV:
    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._free_plain = capacity_blocks
        self._evictable: OrderedDict[int, None] = OrderedDict()  # refcount 0, LRU first
        self._in_use: dict[int, int] = {}  # hash -> refcount
        self._holdings: dict[str, _Holding] = {}

    def free_blocks(self) -> int:
        return self._free_plain + len(self._evictable)

    def hit_blocks(self, hashes: Sequence[int], prompt_tokens: int) -> int:
        """Leading blocks already cached. The last prompt token is always recomputed (it
        yields the first output), so a fully cached prompt still computes one block."""
        usable = (prompt_tokens - 1) // self.block_size
        hits = 0
        for block_hash in hashes[:usable]:
            if block_hash not in self._in_use and block_hash not in self._evictable:
                break
            hits += 1
        return hits

    def blocks_needed(self, hashes: Sequence[int], prompt_tokens: int, total_tokens: int) -> int:
        """Free blocks admission consumes: new blocks, plus cached hits that stop being
        evictable once held."""
        hits = self.hit_blocks(hashes, prompt_tokens)
        reclaimed = sum(1 for h in hashes[:hits] if h in self._evictable)
        return -(-total_tokens // self.block_size) - hits + reclaimed

    def allocate_batch(
        self, requests: Sequence[tuple[str, Sequence[int], int, int]]
    ) -> dict[str, int | None]:
        """Reserve blocks for (request id, hashes, prompt tokens, total tokens) at once.

        Every request's cache hits are pinned before any new block is taken, so one
        request's allocation cannot evict a prefix another one in the same step counted
        on. Returns the cached prompt tokens per request, None where it did not fit.
        """
        for request_id, hashes, prompt_tokens, _ in requests:
            self._holdings[request_id] = holding = _Holding()
            for block_hash in hashes[: self.hit_blocks(hashes, prompt_tokens)]:
                self._evictable.pop(block_hash, None)
                self._in_use[block_hash] = self._in_use.get(block_hash, 0) + 1
                holding.hashed.append(block_hash)
        cached: dict[str, int | None] = {}
        for request_id, _, _, total_tokens in requests:
            holding = self._holdings[request_id]
            new_blocks = -(-total_tokens // self.block_size) - len(holding.hashed)
            if new_blocks > self.free_blocks():
                self.release(request_id)
                cached[request_id] = None
                continue
            for _ in range(new_blocks):
                self._take_free_block()
            holding.plain = new_blocks
            cached[request_id] = len(holding.hashed) * self.block_size
        return cached

    def missing_blocks(self, request_id: str, tokens: int) -> int:
        """Blocks a request must take to hold `tokens` (0 when it holds enough)."""
        holding = self._holdings[request_id]
        return max(-(-tokens // self.block_size) - len(holding.hashed) - holding.plain, 0)

    def ensure_capacity(self, request_id: str, tokens: int) -> bool:
        """Grow a request's blocks to hold `tokens`; False when the cache is full."""
        holding = self._holdings[request_id]
        missing = -(-tokens // self.block_size) - len(holding.hashed) - holding.plain
        if missing > self.free_blocks():
            return False
        for _ in range(max(missing, 0)):
            self._take_free_block()
        holding.plain += max(missing, 0)
        return True

    def _take_free_block(self) -> None:
        if self._free_plain:
            self._free_plain -= 1
        else:
            self._evictable.popitem(last=False)

    def releasable_blocks(self, request_id: str) -> int:
        """Blocks that `release` would make free: private ones and unshared cached ones."""
        holding = self._holdings[request_id]
        return holding.plain + sum(1 for h in holding.hashed if self._in_use[h] == 1)

    def publish_prompt(self, request_id: str, hashes: Sequence[int]) -> None:
        """After a prompt is computed, its full blocks become reusable by later requests."""
        holding = self._holdings[request_id]
        for block_hash in hashes[len(holding.hashed) :]:
            if block_hash in self._in_use or block_hash in self._evictable or not holding.plain:
                continue  # computed twice in the same batch: keep the first copy
            holding.plain -= 1
            self._in_use[block_hash] = 1
            holding.hashed.append(block_hash)

    def release(self, request_id: str) -> None:
        holding = self._holdings.pop(request_id)
        for block_hash in holding.hashed:
            count = self._in_use[block_hash] - 1
            if count:
                self._in_use[block_hash] = count
            else:
                del self._in_use[block_hash]
                self._evictable[block_hash] = None
        self._free_plain += holding.plain
