"""Service process: a deterministic request's key, its answer, and the answer cache.

Under greedy decoding, or sampling with a seed, two requests with the same prompt tokens,
sampling, output constraint and token limit get the same answer from one engine (one
model): `RequestKey` names that request, `SharedOutcome` is its answer, and the
`AnswerCache` keeps finished answers across windows (least recently used evicted first,
under a byte cap), so a later identical request is answered without reaching vLLM (the
answers topic, `service/answercache.py`, fills it from other engines too). Unseeded
sampling gets no key: its rows are meant to differ. Identical requests in flight are
`engine/twins.py`'s.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import msgspec

from relstream.model import RelQuery
from relstream.outputspec import OutputSpec, Sampling

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
