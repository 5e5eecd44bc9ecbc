"""The control topic as an engine reads it: every engine reads every control message (no
consumer group), from the earliest one kept, so a cancel reaches a relQuery still waiting
in Kafka too. An undecodable control message is dead-lettered and reading goes on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from relstream.kafka.clients import new_consumer, start_all
from relstream.kafka.security import PLAINTEXT, KafkaSecurity
from relstream.schemas import ControlMessage, MessageError
from relstream.schemas.formats import decode_record


async def follow_control(
    bootstrap: str,
    topic: str,
    cancel: Callable[[str], Awaitable[None]],
    dead_letter: Callable[[object, str], Awaitable[None]],
    broker_kind: str | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """Call `cancel(relquery_id)` for each cancel request on `topic`, until cancelled."""
    consumer = new_consumer(
        bootstrap, topic, broker_kind=broker_kind, security=security, group_id=None
    )
    await start_all(consumer)
    try:
        async for message in consumer:
            try:
                request = decode_record(ControlMessage, message.value, message.headers)
            except MessageError as exc:
                await dead_letter(message, exc.reason)
                continue
            await cancel(request.cancel)
    finally:
        await consumer.stop()
