"""What a step publishes (`Part`s) and what stands in for a part the broker refuses for
good: one rule for the worker's windows and the engine's results, and for every dead
letter, whoever publishes it (`kafka.delivery.outputs`, the control letters, a plain producer).

A part refused for good is replaced by its `instead`: a window's relQuery by a dead
letter for each of its rows, a result (all its parts: they stand or fall together) by
the relQuery's dead letter, a dead letter by the same without the original's bytes (it
still names the original's topic, partition and offset, where the bytes can be read
again while the topic keeps them, and their size and digest). A letter refused in both
forms is counted in `LOST_LETTERS` by the refusal's kind and logged at error on
"relstream.deadletters" (the first of each kind, outside the outage rate limit): nothing
a producer sends may stop the process that reads it, and a letter that can never be
written would hold its partition for ever.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from aiokafka import AIOKafkaProducer, ConsumerRecord

from relstream.kafka.clients.aio import DEAD_LETTER_ORIGINAL_BYTES
from relstream.kafka.delivery.publish import Refused, Send, publish_sends
from relstream.wire import DeadLetterMessage, encode
from relstream.wire.convert import dead_letter_message

log = logging.getLogger("relstream.kafka.delivery.publish")
lost = logging.getLogger("relstream.deadletters")

LOST_LETTERS: Counter[str] = Counter()  # dead letters the broker refused for good, by kind


def _nothing(refusal: Refused) -> list[Part]:
    return []


@dataclass
class Part:
    """One message of a step's output, and what replaces it if the broker refuses it for
    good. Parts with the same `whole` (a result sent in parts) are replaced together, by
    the refused one's `instead`."""

    send: Send
    instead: Callable[[Refused], list[Part]] = field(default=_nothing)
    whole: str | None = None


def replaced(parts: list[Part], refusal: Refused) -> list[Part]:
    """`parts` with the refused one (and the rest of its whole) replaced by what stands in
    for it; every part replaced where the refusal names none."""
    named = [i for i, part in enumerate(parts) if part.send.what == refusal.what]
    if not named:
        log.error("%s; every message of the step is replaced", refusal)
        return [new for part in parts for new in part.instead(refusal)]
    refused = parts[named[0]]
    log.error("%s; replaced", refusal)
    out: list[Part] = []
    for part in parts:
        if part is refused:
            out += refused.instead(refusal)
        elif refused.whole is None or part.whole != refused.whole:
            out.append(part)
    return out


async def deliver_parts(
    parts: list[Part], publish: Callable[[list[Send]], Awaitable[None]]
) -> list[Part]:
    """`publish` the parts' sends together (a transaction, or a producer's sends), again
    with the refused ones replaced (`replaced`) until the broker takes them; returns the
    parts published."""
    while True:
        try:
            await publish([part.send for part in parts])
            return parts
        except Refused as exc:
            parts = replaced(parts, exc)


def letter_part(
    topic: str, letter: DeadLetterMessage, what: str, on_lost: Callable[[], None] = lambda: None
) -> Part:
    """A dead letter; refused, the same without the original's bytes; refused again,
    counted lost (`letter_lost`, then `on_lost()`)."""
    (full, _), (bare, bare_what) = letter_tries(letter, what)

    def gone(refusal: Refused) -> list[Part]:
        letter_lost(letter, refusal)
        on_lost()
        return []

    bare_part = Part(Send(topic, encode(bare), bare.key, bare_what), gone)
    return Part(Send(topic, encode(full), full.key, what), lambda refusal: [bare_part])


async def deliver_letter(
    topic: str,
    letter: DeadLetterMessage,
    what: str,
    deliver: Callable[[list[Part]], Awaitable[object]],
) -> bool:
    """`letter` delivered by `deliver([part])` (a transaction with its offset, or a
    producer's sends; `letter_part`): True once delivered, False if it was lost, the step
    gone on without it."""
    gone: list[int] = []
    await deliver([letter_part(topic, letter, what, lambda: gone.append(1))])
    return not gone


def letter_tries(letter: DeadLetterMessage, what: str) -> list[tuple[DeadLetterMessage, str]]:
    """The letter, then the same without the original's bytes, each with its log name."""
    bare = msgspec.structs.replace(letter, original=b"", truncated=letter.original_size > 0)
    return [(letter, what), (bare, f"{what} (without its bytes)")]


def letter_lost(letter: DeadLetterMessage, refusal: Refused) -> None:
    """Count (and the first of its kind, log) a letter the broker refused in every form."""
    kind = type(refusal.__cause__ or refusal).__name__
    LOST_LETTERS[kind] += 1
    if LOST_LETTERS[kind] == 1:
        where = f"{letter.topic}[{letter.partition}]@{letter.offset}"
        lost.error("%s; the dead letter of %s (%s) is lost, its offset committed; "
                   "further losses of this kind are counted, not logged",
                   refusal, where, letter.reason)  # fmt: skip


def dead_letter_of(
    record: ConsumerRecord, reason: str, row_keys: list[str] | None = None
) -> tuple[DeadLetterMessage, str]:
    """The dead letter of a consumed `record` (its bytes cut to fit under the request
    limit; the keys of the rows it held, where known), and how log lines name it."""
    letter = dead_letter_message(
        record.value,
        record.topic,
        record.partition,
        record.offset,
        reason,
        record.key,
        DEAD_LETTER_ORIGINAL_BYTES,
        row_keys,
    )
    what = f"the dead letter of {record.topic}[{record.partition}]@{record.offset}"
    return letter, what


async def send_letter(
    producer: AIOKafkaProducer,
    topic: str,
    letter: DeadLetterMessage,
    what: str,
    stalled: Callable[[], None] = lambda: None,
) -> bool:
    """`letter` sent to `topic` until the broker has it (`publish_acked`): True then;
    False if it was lost (`deliver_letter`)."""

    async def deliver(parts: list[Part]) -> None:
        await deliver_parts(parts, lambda sends: publish_sends(producer, sends, stalled))

    return await deliver_letter(topic, letter, what, deliver)


async def send_dead_letter(
    producer: AIOKafkaProducer,
    topic: str,
    record: ConsumerRecord,
    reason: str,
    stalled: Callable[[], None] = lambda: None,
) -> bool:
    """The dead letter of a consumed `record`, sent until the broker has it
    (`send_letter`): True then, False if the broker refuses it for good."""
    letter, what = dead_letter_of(record, reason)
    return await send_letter(producer, topic, letter, what, stalled)
