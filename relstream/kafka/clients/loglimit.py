"""A log rate limit for broker outages: one line per kind and period, with a count.

While a broker is down, every client retries: aiokafka logs each failed connection,
fetch, heartbeat and commit, and relstream each held message, so a 30 s outage wrote
about 1,800 ERROR lines that bury everything else. `RateLimited` lets the first line of a
kind through, holds back the others for `period_s`, and has the next line it lets through
say how many it held back. A kind is the logger, the level and the message's template
(its format string, before its arguments), so "could not connect to node 1" and "... node
2" are one kind. Lines held back at the very end of an outage are not reported: the line
that would carry their count never comes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable


class RateLimited(logging.Filter):
    """Per kind of line: the first in each `period_s` passes, with the count of the ones
    held back since the last that passed."""

    def __init__(self, period_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.period_s = period_s
        self._clock = clock
        self._kinds: dict[tuple[str, int, str], tuple[float, int]] = {}  # -> (passed, held)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, record.levelno, str(record.msg))
        now = self._clock()
        passed, held = self._kinds.get(kind, (None, 0))
        if passed is not None and now - passed < self.period_s:
            self._kinds[kind] = (passed, held + 1)
            return False
        self._kinds[kind] = (now, 0)
        if held:
            record.msg = (
                f"{record.getMessage()} [and {held} more like this in the last "
                f"{now - passed:.0f} s]"
            )
            record.args = None
        return True


# What aiokafka says, in its words, when the broker cannot be reached or answers late.
_OUTAGE_SIGNS = (
    "Unable connect to node",
    "Unable to update metadata",
    "Unable to request metadata",
    "NodeNotReadyError",
    "KafkaConnectionError",
    "Connect call failed",
    "Marking the coordinator dead",
    "RequestTimedOutError",
)
OUTAGE_LINE = (
    "the broker does not answer; retrying, and holding what it has not acknowledged "
    "(nothing is lost or committed past it): %s"
)


class InOurWords(logging.Filter):
    """aiokafka's lines of a broker outage (a failed connect, metadata, fetch, produce or
    heartbeat: one each per reconnect) said as one relstream line, which `RateLimited`
    then lets through once a period with the count; aiokafka's own words kept after it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("aiokafka"):
            said = record.getMessage()
            if any(sign in said for sign in _OUTAGE_SIGNS):
                record.name, record.levelno, record.levelname = (
                    "relstream.kafka", logging.WARNING, "WARNING"
                )  # fmt: skip
                record.msg, record.args = OUTAGE_LINE, (said[:160],)
        return True
