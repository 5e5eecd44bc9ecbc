"""Service process: identical requests in flight computed once (issue: cut the work, not
just reorder it).

Two rows with one `RequestKey` (`engine/answers.py`) get one answer. Within a relQuery
the first such row leads: it sends the request, and the later ones follow it, reporting
its answer under their own rows. Another relQuery with the same request sends its own,
tagged with the key, so each relQuery is ranked as itself; the scheduler runs one of
these twins and holds the others, and the first answer serves every row of the key. A
twin that does not finish (its relQuery cancelled) hands over to the others; when none
is left, its followers each lead again. With an answer cache, a finished answer is kept
there too, and a row whose answer it holds takes it without a request.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

from relstream.engine.answers import AnswerCache, RequestKey, SharedOutcome


@dataclass(eq=False)
class Role:
    """What a row does: run a request of its own (`leads`; `future`, when set, is the
    answer of its key, given by whichever identical request finishes first), follow a
    row of its own relQuery that runs one (`future` gives the answer), or take `cached`."""

    key: RequestKey | None
    leads: bool = True
    future: asyncio.Future | None = None
    cached: SharedOutcome | None = None
    relquery_id: str = ""
    settled: bool = False  # a leader that has given its outcome


@dataclass
class _Twins:
    """Identical requests in flight: one per relQuery that asked, each ranked with its
    own relQuery; the first to finish answers all (`future`)."""

    future: asyncio.Future
    requests: Counter[str] = field(default_factory=Counter)  # relQuery id -> in flight


class SharedRequests:
    """Identical requests in flight, by key, and the answer cache.

    Within one relQuery a key runs once and the other rows follow it. Another relQuery
    with the key sends a request of its own, so it is ranked as itself (a small relQuery
    is not left behind a large one's waiting row); the scheduler plug-in runs one of the
    twins and holds the rest (`scheduler.tracker.RequestTracker`), and whichever finishes
    first answers every row of the key. A twin that ends without an answer (its relQuery
    cancelled) leaves the others to it: one of them runs and answers the rest."""

    def __init__(self, cache: AnswerCache | None = None, twins: bool = True) -> None:
        self.cache = cache
        # False where the scheduler cannot hold a twin (stock vLLM's own queues,
        # `scheduler.registry.holds_twins`): every row of a key follows the one in flight.
        self.twins = twins
        self._twins: dict[RequestKey, _Twins] = {}
        self.followed = 0  # rows answered by another row's request (for tests, metrics)

    def role(self, key: RequestKey | None, relquery_id: str = "") -> Role:
        if key is None:
            return Role(None)
        if not self.twins:
            relquery_id = ""
        twins = self._twins.get(key)
        if twins is None:
            if self.cache is not None and (cached := self.cache.get(key.digest)) is not None:
                return Role(key, cached=cached)
            twins = self._twins[key] = _Twins(asyncio.get_running_loop().create_future())
        elif twins.requests[relquery_id]:
            return Role(key, leads=False, future=twins.future, relquery_id=relquery_id)
        twins.requests[relquery_id] += 1
        return Role(key, future=twins.future, relquery_id=relquery_id)

    def settle(self, role: Role, answer: SharedOutcome | None) -> None:
        """A leader's outcome: its answer (the key's, kept in the cache), or None if it
        did not finish. An answer that ended otherwise than by stop or length (aborted,
        an error) counts as not finished: the cache never holds it. When no request of
        the key is left, its followers get None and take a role again (one leads). Only
        the first settles; a role that does not lead has nothing to settle."""
        if not role.leads or role.key is None or role.settled:
            return
        role.settled = True
        assert role.future is not None
        twins = self._twins.get(role.key)
        if twins is None or twins.future is not role.future:  # answered already
            return
        if answer is not None and answer.complete:
            del self._twins[role.key]
            role.future.set_result(answer)
            if self.cache is not None:
                self.cache.remember(role.key.digest, answer)
            return
        twins.requests[role.relquery_id] -= 1
        if twins.requests[role.relquery_id] <= 0:
            del twins.requests[role.relquery_id]
        if not twins.requests:
            del self._twins[role.key]
            role.future.set_result(None)

    async def answer_of(self, role: Role) -> SharedOutcome | None:
        """The key's answer, or None when no request of it finished. Cancelling the
        follower (its own relQuery cancelled) leaves the others running."""
        answer = await asyncio.shield(role.future)
        if answer is not None:
            self.followed += 1
        return answer
