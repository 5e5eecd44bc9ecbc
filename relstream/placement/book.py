"""Placing relQueries by the load engines report, not by their key's hash (docs/operations.md,
Scale-out).

Engines publish, every few tenths of a second on the metrics topic, the relqueries
partitions they own and their outstanding work (`placement/reports.py`).
A `LoadBook` keeps each engine's latest report and answers `partition_for(relquery)`
through `placement/choice.py`'s `Placement`: a partition of the engine with the least work,
counting the relQueries this placer sent it since its report. With no fresh report it
answers None, and the caller sends as today: the producer hashes the key.

Placing chooses only a partition: the relQuery's id, key and message are the same, and a
message is sent once to the one partition chosen (a retry keeps it), so no relQuery is
lost or doubled by it. An engine that stops reporting stops being chosen once its last
report expires; what was sent to its partitions meanwhile is served by whichever engine
the group gives them, as with the hash.

A book takes only reports it can trust: of its topic, naming partitions that exist (the
relqueries topic's partition count as its reader last read it), dated neither older than
the expiry nor more than MAX_SKEW_S ahead of its clock (one dated in the future would
outlive the engine's real reports), with finite numbers, and signed with the engines'
secret where one is set (the answers' secret: `--answer-secret-file` on the engine,
`RELSTREAM_ANSWER_SECRET` for every process). Anything else is ignored, counted by
reason and logged once a period: no report can stop or steer a placer.

Two followers feed a book (`placement/readers.py`): `LoadReader` for the synchronous
client and `AsyncLoadReader` for asyncio programs such as the worker and the HTTP door.
"""

from __future__ import annotations

import hmac
import logging
import os
import time
from collections import Counter
from typing import NamedTuple

from relstream.kafka.clients.loglimit import RateLimited
from relstream.placement.choice import EXPIRY_S, Choice, Placement
from relstream.placement.load import CHARS_PER_TOKEN, template_id
from relstream.placement.reports import engine_load, report_mac
from relstream.wire import LoadReportMessage, MessageError, RelQueryMessage
from relstream.wire.formats import Headers, decode_record, is_load_report

log = logging.getLogger("relstream.placement")
log.addFilter(RateLimited(30.0))  # a flood of bad reports: one line per kind and period

PLACEMENTS = ("load", "hash")
PLACEMENT_ENV = "RELSTREAM_PLACEMENT"  # "hash" turns placement by load off
MAX_SKEW_S = 2.0  # a report dated further ahead of the reader's clock is not taken


def placement_of(asked: str | None) -> str:
    """The placement asked for, else by `RELSTREAM_PLACEMENT`, else "load"."""
    chosen = asked or os.environ.get(PLACEMENT_ENV, "load")
    if chosen not in PLACEMENTS:
        where = f"{PLACEMENT_ENV}=" if asked is None else "placement "
        raise ValueError(f"{where}{chosen!r}: must be one of {', '.join(PLACEMENTS)}")
    return chosen


def prompt_tokens(message: RelQueryMessage) -> int:
    """Prompt tokens of every row together, estimated from the characters (placement needs
    a relQuery's size before any engine tokenizes it)."""
    per_row = len(message.template) + len(message.system_prompt or "")
    chars = sum(per_row + sum(len(str(v)) for v in row.values.values()) for row in message.rows)
    return chars // CHARS_PER_TOKEN


class Demand(NamedTuple):
    """What placing a relQuery weighs: its key, its size in prompt and output tokens, its
    template and its priority class."""

    key: bytes
    prompt_tokens: int
    output_tokens: int
    template: str
    priority: int = 0


def demand_of(message: RelQueryMessage) -> Demand:
    """A relQuery's demand: a walk over every row, so an event loop computes it in a
    thread (a window may hold 100,000 rows)."""
    output_tokens = message.max_output_tokens * len(message.rows)
    return Demand(
        message.id.encode(), prompt_tokens(message), output_tokens,
        template_id(message.template), message.priority,
    )  # fmt: skip


class LoadBook:
    """The latest report of each engine serving `topic`, and the partition for a
    relQuery chosen from them. Not thread-safe: a reader guards it."""

    def __init__(self, topic: str, expiry: float = EXPIRY_S, clock=time.time,
                 secret: bytes | None = None, partitions: int | None = None) -> None:  # fmt: skip
        self.topic = topic
        self.clock = clock
        self.expiry = expiry
        self.secret = secret  # where set, only reports signed with it are taken
        self.partitions = partitions  # the topic's partition count, where known
        self.ignored: Counter[str] = Counter()  # reports not taken, by reason
        # Its hash fallback is never reached: with no fresh report the caller's producer
        # hashes the key, as it always has.
        self._placement = Placement(partitions=1, expiry=expiry)

    def take(self, value: bytes | None, headers: Headers) -> bool:
        """Keep a metrics topic record if it is a load report for this topic."""
        if not is_load_report(headers):
            return False
        try:
            report = decode_record(LoadReportMessage, value, headers)
        except MessageError as exc:
            log.warning("ignored a load report: %s", exc.reason)
            return False
        if report.topic != self.topic:
            return False
        why = self._untrusted(report)
        if why is not None:
            self.ignored[why] += 1
            if why != "expired":  # a reader starting behind the topic's end reads those
                log.warning(f"ignored load reports: {why} (engine %s)", report.engine)
            return False
        self._placement.report(engine_load(report))
        return True

    def _untrusted(self, report: LoadReportMessage) -> str | None:
        """Why `report` is not to be taken, or None."""
        if self.secret is not None:
            if report.mac is None:
                return "unsigned"
            if not hmac.compare_digest(report.mac, report_mac(self.secret, report)):
                return "badly signed"
        if not report.finite:
            return "work or prices not finite"
        now = self.clock()
        lasts = self._placement.lasts(engine_load(report))  # an idle engine's, longer
        if not now - lasts <= report.at <= now + MAX_SKEW_S:
            return "expired" if report.at < now else "dated in the future"
        if self.partitions is not None and any(p >= self.partitions for p in report.partitions):
            return "names a partition the topic does not have"
        return None

    def engines(self) -> list[str]:
        """Engines with a fresh report that own partitions."""
        return sorted(report.engine for report in self._placement.fresh(self.clock()))

    def partition_for(self, message: RelQueryMessage) -> int | None:
        """The partition for this relQuery, counted as sent there; None with no fresh
        report (send it by its key's hash)."""
        return self.place(demand_of(message))

    def place(self, demand: Demand) -> int | None:
        """`partition_for`, its demand already computed."""
        choice = self.pick(demand)
        return None if choice is None else choice.partition

    def pick(self, demand: Demand, prefer: str | None = None) -> Choice | None:
        """The engine and partition for a relQuery, counted as sent there (`prefer` wins
        among engines within the margin of the least); None with no fresh report."""
        return self._placement.pick(
            demand.prompt_tokens, demand.output_tokens, self.clock(), demand.template, prefer,
            demand.priority,
        )  # fmt: skip
