"""Identical requests computed once, and answers remembered across windows (issue: cut
the work, not just reorder it).

Under greedy decoding, or sampling with a seed, two requests with the same prompt tokens,
sampling, output constraint and token limit get the same answer from one engine (one
model). Within a relQuery the first such row leads: it sends the request, and the later
ones follow it, reporting its answer under their own rows. Another relQuery with the same
request sends its own, tagged with the key, so each relQuery is ranked as itself; the
scheduler runs one of these twins and holds the others, and the first answer serves every
row of the key. A twin that does not finish (its relQuery cancelled) hands over to the
others; when none is left, its followers each lead again. With an answer cache, a
finished answer is also kept (least recently used evicted first, under a byte cap), and a
later identical request is answered from it without reaching vLLM. Unseeded sampling is
never shared nor cached: its rows are meant to differ.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgspec

from relstream.model import RelQuery
from relstream.outputs import OutputSpec, Sampling

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
class SharedOutcome:
    """A finished request's answer, and its step times when it ran (None from the cache).
    `finish_reason` is vLLM's: only "stop" and "length" answers are shared and kept."""

    text: str
    output_tokens: int
    times: Any = None
    finish_reason: str | None = "stop"

    @property
    def complete(self) -> bool:
        return self.finish_reason in CACHEABLE_ENDINGS


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
        self.on_new: Callable[[bytes, SharedOutcome], None] | None = None
        self._entries: OrderedDict[bytes, SharedOutcome] = OrderedDict()

    @staticmethod
    def entry_bytes(digest: bytes, answer: SharedOutcome) -> int:
        return len(digest) + len(answer.text.encode()) + ENTRY_OVERHEAD_BYTES

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._entries  # a look, not a use: no hit, no recency

    def get(self, digest: bytes) -> SharedOutcome | None:
        answer = self._entries.get(digest)
        if answer is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(digest)
        return answer

    def put(self, digest: bytes, answer: SharedOutcome) -> bool:
        """Keep `answer` (without step times: none ran for a row it serves), replacing an
        earlier one under `digest`; False when that same answer was there already or it
        alone exceeds the cap."""
        kept = SharedOutcome(answer.text, answer.output_tokens)
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

    def remember(self, digest: bytes, answer: SharedOutcome) -> None:
        """Keep an answer this engine computed, and pass it to `on_new`; an answer that
        did not end by stop or length is neither."""
        if not answer.complete:
            return
        if self.put(digest, answer) and self.on_new is not None:
            self.on_new(digest, SharedOutcome(answer.text, answer.output_tokens))


class SharedRequests:
    """Identical requests in flight, by key, and the answer cache.

    Within one relQuery a key runs once and the other rows follow it. Another relQuery
    with the key sends a request of its own, so it is ranked as itself (a small relQuery
    is not left behind a large one's waiting row); the scheduler plug-in runs one of the
    twins and holds the rest (`scheduler.view.RequestTracker`), and whichever finishes
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
