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
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgspec

from relstream.answers import OutputSpec, Sampling
from relstream.model import RelQuery

ENTRY_OVERHEAD_BYTES = 256  # a cache entry's table slot and objects, beyond its data


@dataclass(frozen=True)
class RequestKey:
    """What decides a request's answer, so two equal keys get one answer."""

    # The model's exact identity (`engine.identity.ModelIdentity.digest`: full id,
    # revision, dtype, quantization, tokenizer, chat template, vLLM version): another
    # model's answers never match.
    model: str
    token_ids: tuple[int, ...]
    sampling: Sampling
    output: tuple | None  # the output constraint, hashable (a JSON schema as its JSON text)
    max_tokens: int
    salt: str | None = None  # the relQuery's tenant salt: other tenants never share

    @cached_property
    def digest(self) -> bytes:
        """The key as the answer cache and its topic hold it: SHA-256 of every field."""
        return hashlib.sha256(msgspec.json.encode(self)).digest()


# How an answer may end to be shared or kept: vLLM's "abort", "error" and "repetition"
# endings are not the answer the request would get again.
CACHEABLE_ENDINGS = frozenset({"stop", "length"})


@dataclass(frozen=True)
class Answer:
    """A finished request's answer, and its step times when it ran (None from the cache).
    `finish_reason` is vLLM's: only "stop" and "length" answers are shared and kept."""

    text: str
    output_tokens: int
    times: Any = None
    finish_reason: str | None = "stop"

    @property
    def complete(self) -> bool:
        return self.finish_reason in CACHEABLE_ENDINGS


@dataclass(frozen=True)
class Role:
    """What a row does: lead (compute; `future` gets the answer), follow (`future` gives
    it), or take `cached`."""

    key: RequestKey | None
    leads: bool = True
    future: asyncio.Future | None = None
    cached: Answer | None = None


def request_key(relquery: RelQuery, token_ids: list[int], model: str) -> RequestKey | None:
    """The key of a deterministic request (greedy, or seeded) to the model whose identity
    digest is `model`; None otherwise."""
    sampling = relquery.sampling
    if sampling.temperature != 0 and sampling.seed is None:
        return None
    output = _output_key(relquery.output)
    salt = relquery.cache_salt
    return RequestKey(model, tuple(token_ids), sampling, output, relquery.max_output_tokens, salt)


def _output_key(output: OutputSpec | None) -> tuple | None:
    """The constraint as it reaches vLLM. A JSON schema is kept as written, key order
    included: constrained decoding generates an object's properties in the schema's order,
    so `{reasoning, answer}` and `{answer, reasoning}` get different answers."""
    if output is None:
        return None
    schema = None
    if output.json_schema is not None:
        schema = json.dumps(output.json_schema, separators=(",", ":"), ensure_ascii=False)
    return (output.kind, output.choices, schema, output.regex)


class AnswerCache:
    """Answers of deterministic requests by `RequestKey.digest`, least recently used
    evicted first while the entries' bytes exceed `max_bytes`.

    `on_new`, when set, hears of every answer this engine computed and kept (the service
    publishes it to the answers topic); `put` alone, as the topic's reader uses it, keeps
    an answer without telling anyone. A later `put` under a digest replaces the earlier
    answer, and `drop` (a tombstone on the topic) removes it."""

    def __init__(self, max_bytes: int, model: str = "", identity: str = "") -> None:
        self.max_bytes = max_bytes
        self.model = model  # the full model id, for people (logs, the topic's messages)
        self.identity = identity or model  # whose answers it holds (the topic skips others)
        self.bytes = 0
        self.hits = self.misses = 0
        self.on_new: Callable[[bytes, Answer], None] | None = None
        self._entries: OrderedDict[bytes, Answer] = OrderedDict()

    @staticmethod
    def entry_bytes(digest: bytes, answer: Answer) -> int:
        return len(digest) + len(answer.text.encode()) + ENTRY_OVERHEAD_BYTES

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._entries  # a look, not a use: no hit, no recency

    def get(self, digest: bytes) -> Answer | None:
        answer = self._entries.get(digest)
        if answer is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(digest)
        return answer

    def put(self, digest: bytes, answer: Answer) -> bool:
        """Keep `answer` (without step times: none ran for a row it serves), replacing an
        earlier one under `digest`; False when that same answer was there already or it
        alone exceeds the cap."""
        kept = Answer(answer.text, answer.output_tokens)
        size = self.entry_bytes(digest, kept)
        if size > self.max_bytes or self._entries.get(digest) == kept:
            return False
        self.drop(digest)
        self._entries[digest] = kept
        self.bytes += size
        while self.bytes > self.max_bytes:
            old_digest, old = self._entries.popitem(last=False)
            self.bytes -= self.entry_bytes(old_digest, old)
        return True

    def drop(self, digest: bytes) -> bool:
        """Forget the answer under `digest`; False if none was held."""
        old = self._entries.pop(digest, None)
        if old is None:
            return False
        self.bytes -= self.entry_bytes(digest, old)
        return True

    def remember(self, digest: bytes, answer: Answer) -> None:
        """Keep an answer this engine computed, and pass it to `on_new`; an answer that
        did not end by stop or length is neither."""
        if not answer.complete:
            return
        if self.put(digest, answer) and self.on_new is not None:
            self.on_new(digest, Answer(answer.text, answer.output_tokens))


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
        if self.cache is not None and (cached := self.cache.get(key.digest)) is not None:
            return Role(key, cached=cached)
        future: asyncio.Future[Answer | None] = asyncio.get_running_loop().create_future()
        self._leaders[key] = future
        return Role(key, future=future)

    def settle(self, role: Role, answer: Answer | None) -> None:
        """A leader's outcome: its answer (kept in the cache), or None if it did not finish.
        An answer that ended otherwise than by stop or length (aborted, an error) counts as
        not finished: its followers run alone and the cache never holds it. Only the first
        settles; a role that does not lead has nothing to settle."""
        if not role.leads:
            return
        if role.future is None or role.future.done():
            return
        if answer is not None and not answer.complete:
            answer = None
        self._leaders.pop(role.key, None)
        role.future.set_result(answer)
        if answer is not None and self.cache is not None:
            self.cache.remember(role.key.digest, answer)

    async def answer_of(self, role: Role) -> Answer | None:
        """The leader's answer, or None when it did not finish. Cancelling the follower
        (its own relQuery cancelled) leaves the leader running."""
        answer = await asyncio.shield(role.future)
        if answer is not None:
            self.followed += 1
        return answer
