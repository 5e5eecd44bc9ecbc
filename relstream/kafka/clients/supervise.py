"""Background tasks that must not die unseen: a topic's follower (the engine's control
and answers followers, its load reporter, the HTTP door's results follower, a placer's
load reader) runs for the life of its process, and one that ended by an unforeseen
exception used to leave no trace while what waited on it (a forwarded request, a cancel,
placement) waited for nothing.

`supervised` runs such a task: an exception is logged with its traceback and the task is
started again after a capped exponential backoff (`delivery.Backoff`'s rule, from
RESTART_FIRST_S up to RESTART_CAP_S), reset once it has run RESTART_RESET_S without
failing. Cancelling it cancels the task, as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

log = logging.getLogger("relstream.kafka.clients.supervise")

RESTART_FIRST_S = 0.5  # the wait before the first restart, doubled after each
RESTART_CAP_S = 30.0  # at most this
RESTART_RESET_S = 60.0  # a run this long without failing starts the waits over


async def supervised(
    name: str,
    start: Callable[[], Awaitable[None]],
    first_s: float = RESTART_FIRST_S,
    cap_s: float = RESTART_CAP_S,
) -> None:
    """Run `start()` until cancelled, restarting it (logged, with backoff) whenever it
    raises or returns; `name` says which task in the log lines."""
    failures = 0
    while True:
        began = time.monotonic()
        try:
            await start()
            log.error("%s ended; restarting it", name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("%s died; restarting it", name)
        failures = 1 if time.monotonic() - began > RESTART_RESET_S else failures + 1
        await asyncio.sleep(min(first_s * 2 ** (failures - 1), cap_s))
