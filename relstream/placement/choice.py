"""Which engine a relQuery goes to: by outstanding work and the delay it imposes, not a hash.

Engines in one consumer group each own some partitions of the relqueries topic, so the
partition a relQuery is written to picks its engine. Each engine reports, every quarter
second by default, the partitions it owns, its outstanding work in engine seconds (its
own cost fit) and its unfinished relQueries counted by size class, and repeats it
unchanged only as a heartbeat; a report expires after `expiry` seconds (`idle_expiry`
for an idle engine's, which changes rarely). The placer estimates each engine's work as
its last report plus the work the placer itself sent it after that report was measured:
a report read late does not wipe out what was sent after it, which it cannot hold. Among
engines within `margin` of the least, one that recently served the same template wins
(its prompt prefix is cached). Otherwise, among engines within `spread` of the least,
the relQuery goes where it delays the fewest relQueries: an engine runs small relQueries
first, so a relQuery placed there delays the ones larger than it, and placing it beside
relQueries of its own size keeps an engine's large relQueries from being passed by every
small one that arrives (a burst's tail); then the least work. Work is counted at the
relQuery's priority class and above (`Load.ahead_of`): a live relQuery may go where a
backfill runs, as the backfill gives way to it. With no fresh report it
falls back to the key's hash, as a producer's default partitioner does. The same object
places relQueries from the Python client, the worker and the HTTP door
(`placement/book.py`) and among the simulator's engines
(`relstream_lab/placement/run.py`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

from relstream.placement.load import SIZE_CLASSES, Load, size_class, size_counts

EXPIRY_S = 3.0  # a report older than this is not trusted (twelve default report periods)
# An idle engine's report (no work left) is repeated only as a heartbeat, every
# `reports.LOAD_HEARTBEAT_S` (300 s): trusted for two and a half heartbeats, until work
# is sent to it: an engine at work reports every quarter second, so one silent this long
# after the first relQuery sent to it is taken for stopped (a dead idle engine takes
# relQueries for seconds, not for minutes).
IDLE_EXPIRY_S = 750.0
SILENT_AFTER_WORK_S = 10.0
MARGIN = 0.1  # engines within 10 % of the least count as tied for the template
SPREAD = 0.5  # engines within 50 % of the least may take a relQuery where it delays fewest


@dataclass(frozen=True)
class EngineLoad:
    """One engine's report as the placer keeps it: the partitions it owns, its load, and
    when that was measured."""

    engine: str
    partitions: tuple[int, ...]
    load: Load
    at: float


class Choice(NamedTuple):
    """Where a relQuery goes: an engine, and which of its partitions."""

    engine: str
    partition: int


def hash_partition(key: bytes, partitions: int) -> int:
    """The partition a key's hash picks (the fallback, and the baseline)."""
    return zlib.crc32(key) % partitions


@dataclass
class Placement:
    """Places relQueries on the `partitions` of the relqueries topic by engine load."""

    partitions: int
    expiry: float = EXPIRY_S
    idle_expiry: float = IDLE_EXPIRY_S
    silent_after_work: float = SILENT_AFTER_WORK_S
    margin: float = MARGIN
    spread: float = SPREAD
    _reports: dict[str, EngineLoad] = field(default_factory=dict)
    # (when, work, class) of each relQuery sent to an engine after its report was
    # measured: only picks since then, a report's expiry at most, as an engine with no
    # fresh report is never picked
    _sent: dict[str, list[tuple[float, float, int]]] = field(default_factory=dict)
    _turn: dict[str, int] = field(default_factory=dict)  # round robin over its partitions

    def report(self, report: EngineLoad) -> None:
        """A fresh report replaces the engine's last one (an older one is ignored); the
        work sent before it was measured is now in its count, what was sent after is not."""
        last = self._reports.get(report.engine)
        if last is not None and last.at > report.at:
            return
        self._reports[report.engine] = report
        sent = self._sent.get(report.engine, [])
        self._sent[report.engine] = [item for item in sent if item[0] > report.at]

    def estimate(self, engine: str, priority: int = 0) -> float:
        """The engine's outstanding work of class `priority` and above as the placer sees
        it: a lower class gives way (`Load.ahead_of`)."""
        sent = sum(w for _, w, level in self._sent.get(engine, ()) if level >= priority)
        return self._reports[engine].load.ahead_of(priority) + sent

    def delayed(self, engine: str, work: float) -> float:
        """How many of the engine's relQueries a relQuery of `work` engine seconds would
        delay, as the placer sees them: those in larger size classes, and half of those
        in its own (the engine runs the smaller first)."""
        own = size_class(work)
        sent = size_counts(w for _, w, _ in self._sent.get(engine, ()))
        sent = [*sent, *[0] * SIZE_CLASSES]
        counts = [*self._reports[engine].load.size_counts, *[0] * SIZE_CLASSES]
        return (
            sum(counts[k] + sent[k] for k in range(own + 1, SIZE_CLASSES))
            + (counts[own] + sent[own]) / 2
        )

    def fresh(self, now: float) -> list[EngineLoad]:
        """Reports young enough to trust (an idle engine's for longer, until it is silent
        `silent_after_work` after work was sent to it), of engines that own partitions."""
        return [r for r in self._reports.values() if r.partitions and self._trusted(r, now)]

    def _trusted(self, report: EngineLoad, now: float) -> bool:
        if now - report.at > self.lasts(report):
            return False
        sent = self._sent.get(report.engine)  # only what was sent after the report
        return not (report.load.idle and sent and now - sent[0][0] > self.silent_after_work)

    def lasts(self, report: EngineLoad) -> float:
        """How long `report` is trusted: an idle engine repeats its report only as a
        heartbeat."""
        return self.idle_expiry if report.load.idle else self.expiry

    def choose(
        self,
        key: bytes,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        template: str | None = None,
        priority: int = 0,
    ) -> int:
        """The partition for a relQuery of these tokens (its output budget, all rows
        together; its key for the fallback) and class, its work counted as sent to its
        engine."""
        choice = self.pick(prompt_tokens, output_tokens, now, template, priority=priority)
        return hash_partition(key, self.partitions) if choice is None else choice.partition

    def pick(
        self,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        template: str | None = None,
        prefer: str | None = None,
        priority: int = 0,
    ) -> Choice | None:
        """The engine and partition for a relQuery of class `priority`, its work counted
        as sent there; None with no fresh report. `prefer` (an engine's name) wins among
        the tied engines: a door that is itself an engine keeps its relQuery rather than
        send it away."""
        reports = self.fresh(now)
        if not reports:
            return None
        estimate = {r.engine: self.estimate(r.engine, priority) for r in reports}
        least = min(estimate.values())
        tied = [r for r in reports if estimate[r.engine] <= least * (1 + self.margin)]
        mine = [r for r in tied if r.engine == prefer]
        warm = [r for r in tied if template is not None and template in r.load.templates]
        near = [r for r in reports if estimate[r.engine] <= least * (1 + self.spread)]
        if mine or warm or not all(r.load.counted for r in near):
            # An engine that does not count its relQueries (an older release) would look
            # as if it delayed none: where one is near the least, the least work decides.
            chosen = min(mine or warm or tied, key=lambda r: (estimate[r.engine], r.engine))
        else:
            chosen = min(
                near,
                key=lambda r: (
                    self.delayed(r.engine, r.load.work(prompt_tokens, output_tokens)),
                    estimate[r.engine],
                    r.engine,
                ),
            )
        work = chosen.load.work(prompt_tokens, output_tokens)
        self._sent.setdefault(chosen.engine, []).append((now, work, priority))
        turn = self._turn.get(chosen.engine, 0)
        self._turn[chosen.engine] = turn + 1
        return Choice(chosen.engine, chosen.partitions[turn % len(chosen.partitions)])
