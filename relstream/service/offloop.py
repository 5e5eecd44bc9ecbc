"""The engine service's per-relQuery work that grows with its rows, off the event loop.

Decoding a relquery message yields to the loop between slices (`decode_relquery_stepwise`);
what follows it is pure and runs in a worker thread (`asyncio.to_thread`), so the loop
keeps serving heartbeats, fetches and other relQueries while a 100,000-row relQuery is
built, laid out (free fields, within `model.FIELD_LAYOUT_BUDGET`) or answered. The
numbers are in docs/architecture.md ("Bounded work on the event loop").
"""

from __future__ import annotations

import asyncio
import os
import time

from relstream.kafka.clients import RESULT_PART_BYTES
from relstream.model import RelQuery, RelQueryResult, cancelled_result
from relstream.schemas import MetricsMessage, RelQueryMessage, encode
from relstream.schemas.convert import metrics_message, relquery_from_message, result_message
from relstream.schemas.parts import split_result


async def start_threads() -> None:
    """Start the loop's default executor's threads before serving. A thread started while
    others run waits for the GIL inside `Thread.start()`, on the event loop (0.16 s
    measured beside the sim backend's thread)."""
    loop = asyncio.get_running_loop()
    workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    await asyncio.gather(*(loop.run_in_executor(None, time.sleep, 0.05) for _ in range(workers)))


async def relquery_of(message: RelQueryMessage) -> RelQuery:
    """The domain relQuery (its rows, its free field layout); a MessageError as
    `relquery_from_message` raises it."""
    return await asyncio.to_thread(relquery_from_message, message)


async def cancelled(relquery: RelQuery, policy: str, model: str) -> RelQueryResult:
    """`cancelled_result`: every row prepared again to tell errors from cancelled rows."""
    return await asyncio.to_thread(cancelled_result, relquery, policy, model)


def _parts(result: RelQueryResult) -> list[bytes]:
    return [encode(part) for part in split_result(result_message(result), RESULT_PART_BYTES)]


async def result_parts(result: RelQueryResult) -> list[bytes]:
    """The result message encoded, in parts each under the producer's request limit."""
    return await asyncio.to_thread(_parts, result)


async def metrics_of(result: RelQueryResult, engine: str) -> MetricsMessage:
    """The result's metrics message (rows by status, tokens)."""
    return await asyncio.to_thread(metrics_message, result, engine)
