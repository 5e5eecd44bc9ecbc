"""Work that never runs, as the simulated engine models it: identical requests in flight
computed once, and answers remembered across relQueries (relstream.engine.shared does
both on vLLM).

A request carries an `answer_key` when its answer is deterministic (greedy or seeded):
equal keys, equal answers. With `dedup`, a request whose key is in flight follows that
leader: it finishes when the leader does, without a seat, KV or a step of its own. With
an answer cache, a request whose key a finished leader left in the cache is answered at
admission. Output lengths of equal keys must be equal for this to model a real engine:
the trace gives every request of one prompt the same length.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Sharing:
    """Which mechanisms the simulated engine applies (none by default, as stock vLLM)."""

    dedup: bool = False  # identical requests in flight computed once
    cache_entries: int = 0  # answers kept, least recently used evicted first; 0: none


@dataclass(frozen=True)
class Follow:
    """The request follows `leader`, a request in flight with the same key."""

    leader: str


CACHED = "cached"  # the request is answered from the cache at admission
RUN = "run"  # the request runs on the engine (leading any that follow it)


@dataclass
class SharedWork:
    """Leaders in flight by key, the relQueries that wait on each, and the cache."""

    sharing: Sharing
    followed: int = 0  # requests answered by a leader's run
    cached: int = 0  # requests answered from the cache
    _leaders: dict[int, str] = field(default_factory=dict)  # key -> leading request id
    _waiting: dict[str, list[str]] = field(default_factory=dict)  # leader -> relQuery ids
    _cache: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def role(self, request_id: str, relquery_id: str, key: int | None) -> Follow | str:
        """What the request does, decided at its relQuery's admission; a follower's
        relQuery then waits on the leader (`finished` returns it)."""
        if key is None:
            return RUN
        if key in self._cache:
            self._cache.move_to_end(key)
            self.cached += 1
            return CACHED
        leader = self._leaders.get(key) if self.sharing.dedup else None
        if leader is not None:
            self.followed += 1
            self._waiting.setdefault(leader, []).append(relquery_id)
            return Follow(leader)
        if self.sharing.dedup:
            self._leaders[key] = request_id
        return RUN

    def finished(self, request_id: str, key: int | None) -> list[str]:
        """A request ran to its end: its answer is kept; returns the relQueries that
        waited on it, once per following request."""
        if key is None:
            return []
        if self._leaders.get(key) == request_id:
            del self._leaders[key]
        if self.sharing.cache_entries:
            self._cache[key] = None
            self._cache.move_to_end(key)
            while len(self._cache) > self.sharing.cache_entries:
                self._cache.popitem(last=False)
        return self._waiting.pop(request_id, [])
