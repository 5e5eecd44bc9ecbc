"""Identical requests computed once (issue: cut the work, not just reorder it).

Under greedy decoding, or sampling with a seed, two requests with the same prompt tokens,
sampling, output constraint and token limit get the same answer. The first such request
in flight leads: vLLM computes it. Every later one, in the same relQuery or another one
submitted while it runs, follows: it waits for the leader's answer and reports it under
its own row. A leader that does not finish (its relQuery cancelled, the row refused)
gives its followers nothing, and each then runs its own request. Unseeded sampling is
never shared: its rows are meant to differ.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from relstream.answers import OutputSpec, Sampling
from relstream.model import RelQuery


@dataclass(frozen=True)
class RequestKey:
    """What decides a request's answer, so two equal keys get one answer."""

    token_ids: tuple[int, ...]
    sampling: Sampling
    output: OutputSpec | None
    max_tokens: int


@dataclass(frozen=True)
class Answer:
    """A leader's finished request: vLLM's completion and the row's step times."""

    completion: Any
    times: Any


def shareable(relquery: RelQuery) -> bool:
    """Whether the relQuery's rows give one answer per prompt: greedy, or seeded."""
    return relquery.sampling.temperature == 0 or relquery.sampling.seed is not None


def request_key(relquery: RelQuery, token_ids: list[int]) -> RequestKey | None:
    if not shareable(relquery):
        return None
    sampling, output = relquery.sampling, relquery.output
    return RequestKey(tuple(token_ids), sampling, output, relquery.max_output_tokens)


class SharedRequests:
    """The requests in flight that others may follow, by key."""

    def __init__(self) -> None:
        self._leaders: dict[RequestKey, asyncio.Future[Answer | None]] = {}
        self.followed = 0  # rows answered by another row's request (for tests, metrics)

    def follow_or_lead(self, key: RequestKey | None) -> tuple[bool, asyncio.Future | None]:
        """(leads, the future its answer goes to or comes from). A request with no key
        leads alone: (True, None)."""
        if key is None:
            return True, None
        leader = self._leaders.get(key)
        if leader is not None:
            return False, leader
        future: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._leaders[key] = future
        future.add_done_callback(lambda _done: self._leaders.pop(key, None))
        return True, future

    async def answer_of(self, leader: asyncio.Future[Answer | None]) -> Answer | None:
        """The leader's answer, or None when it did not finish. Cancelling the follower
        (its own relQuery cancelled) leaves the leader running."""
        answer = await asyncio.shield(leader)
        if answer is not None:
            self.followed += 1
        return answer
