"""The answer cache backed by a compacted Kafka topic (`--answer-cache topic`).

Every answer an engine computes for a deterministic request goes to the answers topic,
keyed by the request's digest (model, prompt tokens, sampling, output constraint, token
limit), so compaction keeps one answer a request. An engine reads the whole topic into
its cache before it takes work, then keeps reading: a restarted engine, and every engine
of a group, answers a request another one computed without running the model. Answers of
another model are skipped (their digests could never match). Losing an answer on the way
costs a recomputation, never a result: publishing is not awaited by the rows it serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol

from relstream.kafka.clients import create_topics, new_consumer, start_all
from relstream.kafka.security import PLAINTEXT, KafkaSecurity
from relstream.schemas import AnswerMessage, MessageError, decode, encode

log = logging.getLogger("relstream.engine")

LOAD_TIMEOUT_S = 120.0  # reading the topic before serving; past it, serving starts anyway
COMPACTED = {"cleanup.policy": "compact"}


class KeptAnswer(Protocol):
    text: str
    output_tokens: int


class AnswerStore(Protocol):
    """A backend's answer cache as the topic fills it (relstream.engine.shared.AnswerCache)."""

    model: str
    on_new: Callable[[bytes, KeptAnswer], None] | None

    def put(self, digest: bytes, answer: KeptAnswer) -> bool:
        """Keep `answer` under `digest`, telling no one; False if it was there already."""
        ...


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
    ) -> None:
        self.topic = topic
        self.store = store
        self._bootstrap, self._security = bootstrap, security
        self._producer = producer
        self._consumer = new_consumer(
            bootstrap, topic, broker_kind=broker_kind, security=security, group_id=None
        )
        self._sending: set[asyncio.Task] = set()
        self.loaded = 0  # answers of this model taken from the topic
        self.published = 0

    async def start(self) -> None:
        """Create the topic if missing, read it to its end, then publish new answers."""
        await create_topics(self._bootstrap, {self.topic: 1}, self._security, COMPACTED)
        await start_all(self._consumer)
        started = time.monotonic()
        await self._read_to_end(started + LOAD_TIMEOUT_S)
        log.info(
            "answer cache: %d answers of %s read from %s in %.1f s",
            self.loaded,
            self.store.model,
            self.topic,
            time.monotonic() - started,
        )
        self.store.on_new = self._publish

    async def follow(self) -> None:
        """Keep taking the answers other engines publish, until cancelled."""
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
        try:
            answer = decode(AnswerMessage, message.value)
        except MessageError as exc:  # not ours to dead-letter: the topic is relstream's own
            log.warning("answer cache: skipping %s@%s: %s", self.topic, message.offset, exc)
            return
        if answer.model == self.store.model and message.key:
            self.loaded += self.store.put(message.key, answer)

    def _publish(self, digest: bytes, answer: KeptAnswer) -> None:
        message = AnswerMessage(
            model=self.store.model, text=answer.text, output_tokens=answer.output_tokens
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


async def start_answer_topic(
    backend, producer, bootstrap: str, topic: str, broker_kind, security: KafkaSecurity
) -> AnswerTopic | None:
    """`topic` read into `backend`'s answer cache (`--answer-cache topic`), publishing
    with `producer`; None (logged) for a backend that keeps no answers."""
    store = getattr(backend, "answer_cache", None)
    if store is None:
        log.warning("--answer-cache topic: this backend keeps no answers; not used")
        return None
    answers = AnswerTopic(
        bootstrap, topic, store, producer, broker_kind=broker_kind, security=security
    )
    await answers.start()
    return answers
