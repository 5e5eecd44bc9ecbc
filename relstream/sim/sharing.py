"""Work that never runs, as the simulated engine models it: identical requests in flight
computed once, and answers remembered across relQueries (relstream.engine.twins
and relstream.engine.answers do both on vLLM).

A request carries an `answer_key` when its answer is deterministic (greedy or seeded):
equal keys, equal answers. With `dedup`, a request whose key a request of its own relQuery
has in flight follows that leader: it finishes when the leader does, without a seat, KV
or a step of its own. A request of another relQuery with the key is that relQuery's own
(each relQuery is ranked as itself): the tracker runs the first of these twins to start
and holds the others (`SeqInfo.share`), and its answer ends them all. With an answer
cache, a request whose key a finished leader left in the cache is answered at
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
    """Requests in flight by key and relQuery, the relQueries that follow each, and the
    cache."""

    sharing: Sharing
    twins: bool = True  # other relQueries' requests run as twins (`registry.holds_twins`)
    followed: int = 0  # requests answered by another request's run
    cached: int = 0  # requests answered from the cache
    _runs: dict[int, dict[str, str]] = field(default_factory=dict)  # key -> relQuery -> request
    _waiting: dict[str, list[str]] = field(default_factory=dict)  # request -> relQuery ids
    _cache: OrderedDict[int, None] = field(default_factory=OrderedDict)

    def share(self, key: int | None) -> str | None:
        """The tracker's `SeqInfo.share` of a request that runs with `key`."""
        return None if key is None or not (self.sharing.dedup and self.twins) else str(key)

    def role(self, request_id: str, relquery_id: str, key: int | None) -> Follow | str:
        """What the request does, decided at its relQuery's admission; a follower's
        relQuery then waits on the leader (`finished` returns it)."""
        if key is None:
            return RUN
        if key in self._cache:
            self._cache.move_to_end(key)
            self.cached += 1
            return CACHED
        if not self.sharing.dedup:
            return RUN
        runs = self._runs.setdefault(key, {})
        sharer = relquery_id if self.twins else ""  # "": all follow the one in flight
        leader = runs.get(sharer)
        if leader is not None:
            self.followed += 1
            self._waiting.setdefault(leader, []).append(relquery_id)
            return Follow(leader)
        runs[sharer] = request_id
        return RUN

    def finished(self, request_id: str, key: int | None) -> tuple[list[str], list[str]]:
        """A request ran to its end: its answer is kept. Returns its held twins (the
        other relQueries' requests of the key, answered by it), and the relQueries that
        followed it or them, once per following request."""
        if key is None:
            return [], []
        twins = [rid for rid in self._runs.pop(key, {}).values() if rid != request_id]
        self.followed += len(twins)
        if self.sharing.cache_entries:
            self._cache[key] = None
            self._cache.move_to_end(key)
            while len(self._cache) > self.sharing.cache_entries:
                self._cache.popitem(last=False)
        waiting = [rq for rid in (request_id, *twins) for rq in self._waiting.pop(rid, [])]
        return twins, waiting
