"""Consumers that wait out an empty fetch when the broker does not.

A Kafka broker holds a fetch that finds nothing new for up to the consumer's
`fetch_max_wait_ms` (long polling), so an idle consumer sends about two fetches a second.
noida-db 0.2.3, `relstream broker`'s default, answers an empty fetch at once, and
aiokafka's background fetcher sends the next one as soon as the last is answered: one idle
consumer then sent ~5,000 fetches a second and burnt most of a core, and the broker a
fifth of one (docs/benchmarks/idle). Here an empty fetch that came back sooner keeps its
broker's fetch slot until `EMPTY_FETCH_HOLD_S` after it was sent, as a long-polling broker
would have: the next fetch goes out then. Nothing changes where the broker long-polls
(Apache Kafka, Tansu: the answer comes after the wait), nor while fetches bring records.
What it costs: a record that arrives during the hold is fetched at its end, so at most
`EMPTY_FETCH_HOLD_S` later than at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from aiokafka import AIOKafkaConsumer

# The shortest time between a consumer's fetches from one broker while they come back
# empty: ~4 fetches a second at idle instead of thousands, and what a record written to an
# idle partition may wait at most before it is fetched (docs/benchmarks/idle).
EMPTY_FETCH_HOLD_S = 0.25


class HeldFetchConsumer(AIOKafkaConsumer):
    """An AIOKafkaConsumer whose empty fetches take `EMPTY_FETCH_HOLD_S` at least (or
    `fetch_max_wait_ms`, if shorter: never longer than the broker is asked to wait)."""

    def __init__(self, *topics: str, **options) -> None:
        super().__init__(*topics, **options)
        self._empty_fetch_hold_s = min(
            EMPTY_FETCH_HOLD_S, options.get("fetch_max_wait_ms", 500) / 1000
        )

    async def start(self) -> None:
        await super().start()
        hold_empty_fetches(self._fetcher, self._empty_fetch_hold_s)


def hold_empty_fetches(fetcher, hold_s: float) -> None:
    """Make the aiokafka `fetcher`'s fetches that bring nothing last `hold_s` at least.

    aiokafka's fetcher sends one fetch per broker at a time, from a task of its own, and the
    next only once that task ends; the task's result says whether records came. The hold
    is added at the end of that task, so the fetcher's own loop, which also serves seeks,
    pauses and offset resets, runs as before."""
    fetch = fetcher._proc_fetch_request

    async def held(assignment, node_id, request) -> bool:
        sent = time.monotonic()
        fetched = await fetch(assignment, node_id, request)
        rest = hold_s - (time.monotonic() - sent)
        if not fetched and rest > 0:
            # The fetcher cancels its fetches when it closes or its assignment changes,
            # then awaits them expecting no error, as aiokafka's own fetch returns.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(rest)
        return fetched

    fetcher._proc_fetch_request = held
