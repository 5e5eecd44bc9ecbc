"""Identical requests computed once, and answers remembered across windows (issue: cut
the work, not just reorder it).

Under greedy decoding, or sampling with a seed, two requests with the same prompt tokens,
sampling, output constraint and token limit get the same answer from one engine (one
model). The first such request in flight leads: vLLM computes it. Every later one, in the
same relQuery or another one submitted while it runs, follows: it waits for the leader's
answer and reports it under its own row. A leader that does not finish (its relQuery
cancelled, the row refused) gives its followers nothing, and each then runs its own
request. With an answer cache, a finished answer is also kept (least recently used
evicted first, under a byte cap), and a later identical request is answered from it
without reaching vLLM. Unseeded sampling is never shared nor cached: its rows are meant to
differ.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from relstream.answers import OutputSpec, Sampling
from relstream.model import RelQuery

ENTRY_OVERHEAD_BYTES = 256  # a cache entry's key, answer and table slot, beyond the data


@dataclass(frozen=True)
class RequestKey:
    """What decides a request's answer, so two equal keys get one answer."""

    token_ids: tuple[int, ...]
    sampling: Sampling
    output: tuple | None  # the output constraint, hashable (a JSON schema as sorted JSON)
    max_tokens: int


@dataclass(frozen=True)
class Answer:
    """A finished request's answer, and its step times when it ran (None from the cache)."""

    text: str
    output_tokens: int
    times: Any = None


@dataclass(frozen=True)
class Role:
    """What a row does: lead (compute; `future` gets the answer), follow (`future` gives
    it), or take `cached`."""

    key: RequestKey | None
    leads: bool = True
    future: asyncio.Future | None = None
    cached: Answer | None = None


def request_key(relquery: RelQuery, token_ids: list[int]) -> RequestKey | None:
    """The key of a deterministic request (greedy, or seeded); None otherwise."""
    sampling = relquery.sampling
    if sampling.temperature != 0 and sampling.seed is None:
        return None
    return RequestKey(
        tuple(token_ids), sampling, _output_key(relquery.output), relquery.max_output_tokens
    )


def _output_key(output: OutputSpec | None) -> tuple | None:
    if output is None:
        return None
    schema = None if output.json_schema is None else json.dumps(output.json_schema, sort_keys=True)
    return (output.kind, output.choices, schema, output.regex)


class AnswerCache:
    """Answers of deterministic requests, least recently used evicted first while the
    entries' bytes exceed `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[RequestKey, Answer] = OrderedDict()

    @staticmethod
    def entry_bytes(key: RequestKey, answer: Answer) -> int:
        return 8 * len(key.token_ids) + len(answer.text.encode()) + ENTRY_OVERHEAD_BYTES

    def get(self, key: RequestKey) -> Answer | None:
        answer = self._entries.get(key)
        if answer is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return answer

    def put(self, key: RequestKey, answer: Answer) -> None:
        kept = Answer(answer.text, answer.output_tokens)  # no step times: none ran for it
        if self.entry_bytes(key, kept) > self.max_bytes or key in self._entries:
            return
        self._entries[key] = kept
        self.bytes += self.entry_bytes(key, kept)
        while self.bytes > self.max_bytes:
            old_key, old = self._entries.popitem(last=False)
            self.bytes -= self.entry_bytes(old_key, old)


class SharedRequests:
    """The requests in flight that others may follow, by key, and the answer cache."""

    def __init__(self, cache: AnswerCache | None = None) -> None:
        self.cache = cache
        self._leaders: dict[RequestKey, asyncio.Future[Answer | None]] = {}
        self.followed = 0  # rows answered by another row's request (for tests, metrics)

    def role(self, key: RequestKey | None) -> Role:
        if key is None:
            return Role(None)
        leader = self._leaders.get(key)
        if leader is not None:
            return Role(key, leads=False, future=leader)
        if self.cache is not None and (cached := self.cache.get(key)) is not None:
            return Role(key, cached=cached)
        future: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._leaders[key] = future
        return Role(key, future=future)

    def settle(self, role: Role, answer: Answer | None) -> None:
        """A leader's outcome: its answer (kept in the cache), or None if it did not finish.
        Only the first settles; a role that does not lead has nothing to settle."""
        if not role.leads:
            return
        if role.future is None or role.future.done():
            return
        self._leaders.pop(role.key, None)
        role.future.set_result(answer)
        if answer is not None and self.cache is not None:
            self.cache.put(role.key, answer)

    async def answer_of(self, role: Role) -> Answer | None:
        """The leader's answer, or None when it did not finish. Cancelling the follower
        (its own relQuery cancelled) leaves the leader running."""
        answer = await asyncio.shield(role.future)
        if answer is not None:
            self.followed += 1
        return answer
