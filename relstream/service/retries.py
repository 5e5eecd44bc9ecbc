"""Engine process: a relQuery served again after a failure, or not.

A failure the same input repeats (`DETERMINISTIC`: the backend says the relQuery can
never be served as it is) is dead-lettered at once, in one log line. Anything else may
pass (a backend's transient trouble): tried `max_attempts` times in all, with doubling
waits, one warning line a failed try. Tracebacks go to the debug level only. An
`EngineFailure` is the engine's, not the relQuery's: it is raised on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from relstream.backend import EngineFailure
from relstream.model import RelQueryResult

log = logging.getLogger("relstream.engine")

DETERMINISTIC = (ValueError, TypeError)


async def serve_with_retries(
    serve: Callable[[], Awaitable[RelQueryResult]],
    relquery_id: str,
    max_attempts: int,
    backoff_s: float,
) -> RelQueryResult | str:
    """`serve()`'s result, or the reason to dead-letter the relQuery."""
    for attempt in range(1, max_attempts + 1):
        try:
            return await serve()
        except EngineFailure:
            raise
        except DETERMINISTIC as exc:
            log.error("could not serve %s: %s", relquery_id, exc)
            log.debug("serving %s", relquery_id, exc_info=True)
            return f"serving failed: {exc!r}"
        except Exception as exc:
            log.debug("serving %s (try %d)", relquery_id, attempt, exc_info=True)
            if attempt == max_attempts:
                log.error("serving %s failed %d times: %r", relquery_id, attempt, exc)
                return f"serving failed {attempt} times; last error: {exc!r}"
            log.warning(
                "serving %s failed (try %d of %d): %r; tried again in %.1f s",
                relquery_id, attempt, max_attempts, exc, backoff_s,
            )  # fmt: skip
        await asyncio.sleep(backoff_s)
        backoff_s *= 2
    raise AssertionError("unreachable")
