"""The newest rows of a table's topic, read at the worker's start with no consumer group,
so that a template column no row has (a typo) is said once before any window is cut
(`columns`). Every such row is dead-lettered whatever is said: this only says it early,
where an operator reads (the worker's log), instead of row by row later.
"""

from __future__ import annotations

import asyncio
import logging

from relstream.kafka.clients.aio import assign_all, new_consumer
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.stream.columns import missing_said
from relstream.wire import MessageError, RowMessage
from relstream.wire.formats import decode_record

log = logging.getLogger(__name__)
PEEK_S = 3.0  # the newest rows are looked for this long at most at the start
TAIL = 8  # offsets read back from each partition's end for its newest row


async def newest_rows(
    bootstrap: str,
    topic: str,
    security: KafkaSecurity = PLAINTEXT,
    broker_kind: str | None = None,
    within: float = PEEK_S,
) -> list[RowMessage]:
    """The newest readable row of each partition of `topic` (none where it is empty or
    not read within `within`), read with no consumer group."""
    consumer = new_consumer(bootstrap, broker_kind=broker_kind, security=security)
    await consumer.start()
    try:
        parts = await assign_all(consumer, topic)
        ends = await consumer.end_offsets(parts)
        starts = await consumer.beginning_offsets(parts)
        wanted = [p for p in parts if ends[p] > starts[p]]
        if not wanted:  # never assigned none: aiokafka's stop then waits on its fetcher
            return []
        consumer.assign(wanted)
        for partition in wanted:  # a few back: the last offsets may be markers
            consumer.seek(partition, max(starts[partition], ends[partition] - TAIL))
        rows: dict = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        unread = set(wanted)
        while unread and loop.time() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            for partition, records in batches.items():
                for record in records:
                    try:
                        rows[partition] = decode_record(RowMessage, record.value, record.headers)
                    except MessageError:
                        continue
            unread = {p for p in unread if await consumer.position(p) < ends[p]}
        return list(rows.values())
    finally:
        await consumer.stop()


async def say_missing_columns(
    query: str,
    needed: tuple[str, ...],
    bootstrap: str,
    topic: str,
    security: KafkaSecurity = PLAINTEXT,
    broker_kind: str | None = None,
) -> str | None:
    """A warning where the newest rows of `topic` lack a column `query` uses (returned,
    and logged); None where they have them all, or none is read."""
    try:
        rows = await newest_rows(bootstrap, topic, security, broker_kind)
    except Exception as exc:  # only a look: the worker starts whatever it finds
        log.debug("query %s: the newest rows of %s not read (%s)", query, topic, exc)
        return None
    for row in rows:
        said = missing_said(query, needed, row.key, row.values, f"the newest row of {topic}")
        if said is not None:
            log.warning("%s", said)
            return said
    return None
