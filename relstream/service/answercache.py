"""The answer cache backed by a compacted Kafka topic (`--answer-cache topic`).

Every answer an engine computes for a deterministic request goes to the answers topic,
keyed by the request's digest (the model's exact identity, prompt tokens, sampling, output
constraint, token limit, tenant salt), so compaction keeps one answer a request. An engine
reads the whole topic into its cache before it takes work, then keeps reading: a restarted
engine, and every engine of a group, answers a request another one computed without
running the model. Losing an answer on the way costs a recomputation, never a result:
publishing is not awaited by the rows it serves.

Only engines can write answers: each carries an HMAC-SHA256, with a secret the engines
share, over its key and fields. An answer without one, or whose MAC does not match (a
forgery, another secret, an answer of an earlier release), is ignored and counted. Answers
of another model identity are skipped without being kept. A later answer under a key
replaces the earlier one, and a tombstone (a null value) removes it, also from running
engines: `relstream answers purge` tombstones every key.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import msgspec

from relstream.kafka.clients.aio import new_consumer, start_all
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.supervise import supervised
from relstream.wire import AnswerMessage, MessageError, decode, encode

log = logging.getLogger("relstream.engine")

LOAD_TIMEOUT_S = 120.0  # reading the topic before serving; past it, serving starts anyway
# Compacted (one answer a key) and bounded: an answer older than the retention, or past
# the size bound of the partition, is deleted, and asked again it is recomputed.
RETENTION_MS = 7 * 24 * 3600 * 1000
RETENTION_BYTES = 1 << 30
TOPIC_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": str(RETENTION_MS),
    "retention.bytes": str(RETENTION_BYTES),
}
SECRET_ENV = "RELSTREAM_ANSWER_SECRET"
SECRET_OPTION = "--answer-secret-file"
MIN_SECRET_BYTES = 16
MAC_CONTEXT = b"relstream.answer.v2\0"
REJECTION_LOG_PERIOD_S = 30.0


class AnswerSecretError(ValueError):
    """No usable shared secret for the answers topic; the message names the options."""


def answer_secret(path: str | os.PathLike | None = None) -> bytes:
    """The secret the engines share: the file at `path` (its trailing newline dropped),
    else the environment variable RELSTREAM_ANSWER_SECRET; raises AnswerSecretError
    naming both when neither gives at least 16 bytes."""
    where = f"{SECRET_OPTION} {path}" if path is not None else f"${SECRET_ENV}"
    if path is not None:
        try:
            secret = Path(path).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise AnswerSecretError(f"{where}: cannot be read ({exc.strerror})") from None
    else:
        secret = os.environ.get(SECRET_ENV, "").encode()
    if not secret:
        raise AnswerSecretError(
            "--answer-cache topic needs the secret the engines share, so that only they can "
            f"write answers: give {SECRET_OPTION} PATH or set {SECRET_ENV}"
        )
    if len(secret) < MIN_SECRET_BYTES:
        raise AnswerSecretError(f"{where}: the secret is under {MIN_SECRET_BYTES} bytes")
    return secret


def answer_mac(secret: bytes, key: bytes, model: str, identity: str, text: str, tokens: int):
    """HMAC-SHA256 over the key and every other field of an answer message."""
    fields = msgspec.msgpack.encode([model, identity, text, tokens])
    return hmac.new(secret, MAC_CONTEXT + key + fields, hashlib.sha256).digest()


def signed_answer(secret: bytes, key: bytes, model: str, identity: str, text: str, tokens: int):
    """The answer message under `key`, signed."""
    mac = answer_mac(secret, key, model, identity, text, tokens)
    return AnswerMessage(model=model, identity=identity, text=text, output_tokens=tokens, mac=mac)


class KeptAnswer(Protocol):
    text: str
    output_tokens: int


class AnswerStore(Protocol):
    """A backend's answer cache as the topic fills it (relstream.engine.answers.AnswerCache)."""

    model: str  # the full model id
    identity: str  # hex SHA-256 of the model's exact identity
    on_new: Callable[[bytes, KeptAnswer], None] | None

    def put(self, digest: bytes, answer: KeptAnswer) -> bool:
        """Keep `answer` under `digest` (replacing an earlier one), telling no one; False
        if that same answer was there already."""
        ...

    def drop(self, digest: bytes) -> bool:
        """Forget the answer under `digest`; False if none was held."""
        ...


class _Counter(Protocol):  # a prometheus_client Counter with a `reason` label
    def labels(self, reason: str): ...


class AnswerTopic:
    """Fills `store` from the answers topic and publishes what the engine computes."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        store: AnswerStore,
        producer,
        broker_kind: str | None = None,
        security: KafkaSecurity = PLAINTEXT,
        *,
        secret: bytes | None,
        rejected: _Counter | None = None,
    ) -> None:
        if not secret:
            raise AnswerSecretError(
                f"the answers topic needs the engines' shared secret ({SECRET_OPTION} PATH "
                f"or {SECRET_ENV})"
            )
        self.topic = topic
        self.store = store
        self._secret = secret
        self._bootstrap, self._security = bootstrap, security
        self._producer = producer
        self._consumer = new_consumer(
            bootstrap, topic, broker_kind=broker_kind, security=security, group_id=None
        )
        self._sending: set[asyncio.Task] = set()
        self._rejected_metric = rejected
        self._rejection_logged: dict[str, tuple[float, int]] = {}  # reason -> (at, held)
        self.loaded = 0  # answers of this model taken from the topic
        self.published = 0
        self.removed = 0  # answers a tombstone took out of the cache
        self.other_identity = 0  # valid answers of another model, skipped
        self.rejected: dict[str, int] = {}  # by reason: "unsigned", "forged", "malformed"

    async def start(self) -> None:
        """Create the topic if missing, read it to its end, then publish new answers."""
        await create_topics(self._bootstrap, {self.topic: 1}, self._security, TOPIC_CONFIG)
        await start_all(self._consumer)
        started = time.monotonic()
        await self._read_to_end(started + LOAD_TIMEOUT_S)
        log.info(
            "answer cache: %d answers of %s read from %s in %.1f s (%d rejected)",
            self.loaded,
            self.store.model,
            self.topic,
            time.monotonic() - started,
            sum(self.rejected.values()),
        )
        self.store.on_new = self._publish

    async def follow(self) -> None:
        """Keep taking the answers other engines publish, until cancelled; restarted
        (logged, with backoff) if it dies."""
        await supervised("the answers follower", self._follow)

    async def _follow(self) -> None:
        async for message in self._consumer:
            self._keep(message)

    async def stop(self) -> None:
        self.store.on_new = None
        await asyncio.gather(*self._sending, return_exceptions=True)
        await self._consumer.stop()

    async def _read_to_end(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            batches = await self._consumer.getmany(timeout_ms=200, max_records=1000)
            for messages in batches.values():
                for message in messages:
                    self._keep(message)
            assigned = self._consumer.assignment()
            if assigned and not batches and await self._at_end(assigned):
                return
        log.warning("answer cache: %s not read to its end in %.0f s", self.topic, LOAD_TIMEOUT_S)

    async def _at_end(self, partitions) -> bool:
        ends = await self._consumer.end_offsets(list(partitions))
        return all([await self._consumer.position(tp) >= end for tp, end in ends.items()])

    def _keep(self, message) -> None:
        key = message.key or b""
        if message.value is None:  # a tombstone: the answer is gone
            self.removed += self.store.drop(key)
            return
        try:
            answer = decode(AnswerMessage, message.value)
        except MessageError as exc:  # not ours to dead-letter: the topic is relstream's own
            self._reject(_unsigned_or_malformed(message.value), message.offset, exc.reason)
            return
        fields = (answer.model, answer.identity, answer.text, answer.output_tokens)
        if not hmac.compare_digest(answer.mac, answer_mac(self._secret, key, *fields)):
            self._reject("forged", message.offset, "its MAC does not match (key or text)")
            return
        if answer.identity != self.store.identity:
            self.other_identity += 1
            return
        self.loaded += self.store.put(key, answer)

    def _reject(self, reason: str, offset: int, why: str) -> None:
        """Count an answer that is ignored; one log line per reason and period."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
        if self._rejected_metric is not None:
            self._rejected_metric.labels(reason).inc()
        now = time.monotonic()
        logged_at, held = self._rejection_logged.get(reason, (None, 0))
        if logged_at is not None and now - logged_at < REJECTION_LOG_PERIOD_S:
            self._rejection_logged[reason] = (logged_at, held + 1)
            return
        self._rejection_logged[reason] = (now, 0)
        more = f" [and {held} more since]" if held else ""
        where = f"{self.topic}@{offset}"
        log.warning("answer cache: ignoring an answer (%s) at %s: %s%s", reason, where, why, more)

    def _publish(self, digest: bytes, answer: KeptAnswer) -> None:
        message = signed_answer(
            self._secret,
            digest,
            self.store.model,
            self.store.identity,
            answer.text,
            answer.output_tokens,
        )
        task = asyncio.ensure_future(self._send(digest, encode(message)))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, digest: bytes, value: bytes) -> None:
        try:
            await self._producer.send_and_wait(self.topic, value, key=digest)
            self.published += 1
        except Exception as exc:  # a lost answer is recomputed when asked again
            log.warning("answer cache: an answer was not published to %s: %s", self.topic, exc)


def _unsigned_or_malformed(value: bytes) -> str:
    """Why an answer did not decode: "unsigned" when it is a map without a MAC (an
    earlier release's version 1 answer, say), else "malformed"."""
    try:
        fields = msgspec.msgpack.decode(value)
    except msgspec.DecodeError:
        return "malformed"
    return "unsigned" if isinstance(fields, dict) and "mac" not in fields else "malformed"


async def start_answer_topic(
    backend,
    producer,
    bootstrap: str,
    topic: str,
    broker_kind,
    security: KafkaSecurity,
    secret: bytes | None = None,
    rejected: _Counter | None = None,
) -> AnswerTopic | None:
    """`topic` read into `backend`'s answer cache (`--answer-cache topic`), publishing
    with `producer`, signing and checking with `secret`; None (logged) for a backend that
    keeps no answers."""
    store = getattr(backend, "answer_cache", None)
    if store is None:
        log.warning("--answer-cache topic: this backend keeps no answers; not used")
        return None
    answers = AnswerTopic(
        bootstrap, topic, store, producer, broker_kind, security, secret=secret, rejected=rejected
    )
    await answers.start()
    return answers


async def purge_answers(
    bootstrap: str,
    topic: str,
    broker_kind: str | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> int:
    """Tombstone every key of the answers topic (`relstream answers purge`): running
    engines drop those answers as they read the tombstones, later ones never load them,
    and compaction deletes them. Returns the keys tombstoned."""
    from relstream.kafka.clients.aio import new_producer, running

    keys = await _keys_of(bootstrap, topic, broker_kind, security)
    producer = new_producer(bootstrap, security)
    async with running(producer):
        for key in keys:
            await producer.send(topic, None, key=key)
        await producer.flush()
    return len(keys)


async def _keys_of(bootstrap: str, topic: str, broker_kind, security) -> set[bytes]:
    """The keys whose last message on `topic` is not a tombstone."""
    consumer = new_consumer(
        bootstrap, topic, broker_kind=broker_kind, security=security, group_id=None
    )
    await start_all(consumer)
    live: set[bytes] = set()
    try:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200, max_records=1000)
            for messages in batches.values():
                for message in messages:
                    if message.value is None:
                        live.discard(message.key)
                    elif message.key:
                        live.add(message.key)
            assigned = consumer.assignment()
            if assigned and not batches:
                ends = await consumer.end_offsets(list(assigned))
                if all([await consumer.position(tp) >= end for tp, end in ends.items()]):
                    break
    finally:
        await consumer.stop()
    return live
