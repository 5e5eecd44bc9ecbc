"""The engine service's per-relQuery work that grows with its rows, off the event loop.

Decoding a relquery message yields to the loop between slices (`decode_relquery_stepwise`);
what follows it is pure and runs in a worker thread (`asyncio.to_thread`), so the loop
keeps serving heartbeats, fetches and other relQueries while a 100,000-row relQuery is
built, laid out (free fields, within `fieldlayout.FIELD_LAYOUT_BUDGET`) or answered. The
numbers are in docs/architecture/engine.md ("Bounded work on the event loop").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time

from relstream.kafka.clients.aio import RESULT_PART_BYTES
from relstream.model import RelQuery, RelQueryResult, cancelled_result
from relstream.wire import MetricsMessage, RelQueryMessage
from relstream.wire.convert import metrics_message, relquery_from_message, result_message
from relstream.wire.formats import Format, encode_as
from relstream.wire.parts import split_result

WORKER_NICE = 10  # the worker threads' nice value: the event loop's thread runs first


async def start_threads() -> None:
    """Start the loop's default executor's threads before serving, each at a lower CPU
    priority than the loop's thread (Linux). A thread started while others run waits for
    the GIL inside `Thread.start()`, on the event loop (0.16 s measured beside the sim
    backend's thread); and where the cores are busy, the loop's thread gets one first."""
    loop = asyncio.get_running_loop()
    workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
    await asyncio.gather(*(loop.run_in_executor(None, _start_worker) for _ in range(workers)))


def _start_worker() -> None:
    if sys.platform == "linux":
        with contextlib.suppress(OSError):  # a thread's nice value, on Linux only
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
    time.sleep(0.05)  # held, so that every worker starts


async def relquery_of(message: RelQueryMessage) -> RelQuery:
    """The domain relQuery (its rows, its free field layout); a MessageError as
    `relquery_from_message` raises it."""
    return await asyncio.to_thread(relquery_from_message, message)


async def cancelled(relquery: RelQuery, policy: str, model: str) -> RelQueryResult:
    """`cancelled_result`: every row prepared again to tell errors from cancelled rows."""
    return await asyncio.to_thread(cancelled_result, relquery, policy, model)


def _parts(result: RelQueryResult, fmt: Format) -> list[bytes]:
    parts = split_result(result_message(result), RESULT_PART_BYTES, fmt)
    return [encode_as(part, fmt) for part in parts]


async def result_parts(result: RelQueryResult, fmt: Format = "msgpack") -> list[bytes]:
    """The result message encoded in `fmt`, in parts each under the producer's request
    limit."""
    return await asyncio.to_thread(_parts, result, fmt)


async def metrics_of(result: RelQueryResult, engine: str) -> MetricsMessage:
    """The result's metrics message (rows by status, tokens)."""
    return await asyncio.to_thread(metrics_message, result, engine)
