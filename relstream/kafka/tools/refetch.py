"""The originals of dead letters whose bytes were cut to fit (`truncated`: a relQuery of
over 512 KiB), read again from where they came, so `relstream replay` can send them back
whole: the letter names the original's topic, partition and offset, and its size and
SHA-256. The message read there is taken only if it is the same message (its size and
digest match): a topic that no longer keeps it (retention), or was re-created since,
gives nothing, and the letter is counted as one that cannot go back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from relstream.kafka.clients.aio import new_consumer, running
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.wire import DeadLetterMessage

FETCH_S = 10.0  # how long one original is waited for


@dataclass
class Refetched:
    """The originals read again, by topic as (key, bytes), the letters they were read for
    (`read`), and the letters whose original is gone (`gone`: how each is named)."""

    messages: dict[str, list[tuple[bytes | None, bytes]]] = field(default_factory=dict)
    read: list[DeadLetterMessage] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)


def same(letter: DeadLetterMessage, value: bytes | None) -> bool:
    """Whether `value` is the message `letter` was written about."""
    data = value or b""
    return len(data) == letter.original_size and (
        hashlib.sha256(data).hexdigest() == letter.original_sha256
    )


async def refetch(
    bootstrap: str,
    letters: Iterable[DeadLetterMessage],
    security: KafkaSecurity = PLAINTEXT,
    broker_kind: str | None = None,
    fetch_s: float = FETCH_S,
) -> Refetched:
    """Each letter's original, read at its topic, partition and offset (uncommitted
    reads: a relQuery written in a transaction is read whatever became of it, and its
    digest decides)."""
    found = Refetched()
    consumer = new_consumer(
        bootstrap, broker_kind=broker_kind, security=security, group_id=None,
        isolation_level="read_uncommitted",
    )  # fmt: skip
    async with running(consumer):
        for letter in letters:
            where = f"{letter.topic}[{letter.partition}]@{letter.offset}"
            if letter.partition is None or letter.offset is None:
                found.gone.append(f"{where} (the letter names no offset)")
                continue
            partition = TopicPartition(letter.topic, letter.partition)
            consumer.assign([partition])
            consumer.seek(partition, letter.offset)
            batch = await consumer.getmany(partition, timeout_ms=int(fetch_s * 1000),
                                           max_records=1)  # fmt: skip
            records = batch.get(partition, [])
            if records and records[0].offset == letter.offset and same(letter, records[0].value):
                record = records[0]
                found.messages.setdefault(letter.topic, []).append((record.key, record.value))
                found.read.append(letter)
            else:
                found.gone.append(f"{where} (not kept there any more)")
    return found
