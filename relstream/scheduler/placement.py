"""Which engine a relQuery goes to: the one with the least outstanding work, not a hash.

Engines in one consumer group each own some partitions of the relqueries topic, so the
partition a relQuery is written to picks its engine. Each engine reports, about once a
second, the partitions it owns and its outstanding work in engine seconds (its own cost
fit); a report expires after `expiry` seconds. The placer sends a relQuery to the engine
with the least work: its last report plus the work the placer itself sent it since.
Among engines within `margin` of the least, one that recently served the same template
is preferred (its prompt prefix is cached). With no fresh report it falls back to the
key's hash, as a producer's default partitioner does. The same object places relQueries
from the Python client (`relstream/placer.py`) and among the simulator's engines
(`relstream_lab/placement/run.py`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import NamedTuple

EXPIRY_S = 3.0  # a report older than this is not trusted (three report periods)
MARGIN = 0.1  # engines within 10 % of the least count as tied


@dataclass(frozen=True)
class EngineLoad:
    """One engine's report: what it owns and the work it has yet to do."""

    engine: str
    partitions: tuple[int, ...]
    outstanding_s: float  # engine seconds of work left, its relQueries together
    at: float  # when it was measured
    templates: tuple[str, ...] = ()  # templates it served lately, most recent first
    per_prompt_token_s: float = 0.0  # its cost fit: what a prompt token costs it
    per_output_token_s: float = 0.0  # and an output token, its step shared by the batch

    def work(self, prompt_tokens: int, output_tokens: int) -> float:
        """Engine seconds a relQuery of these tokens adds to this engine."""
        return self.per_prompt_token_s * prompt_tokens + self.per_output_token_s * output_tokens


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
    margin: float = MARGIN
    _reports: dict[str, EngineLoad] = field(default_factory=dict)
    _sent: dict[str, float] = field(default_factory=dict)  # work sent since each report
    _turn: dict[str, int] = field(default_factory=dict)  # round robin over its partitions

    def report(self, load: EngineLoad) -> None:
        """A fresh report replaces the engine's last one (an older one is ignored); the
        work sent before it is now in its count."""
        last = self._reports.get(load.engine)
        if last is not None and last.at > load.at:
            return
        self._reports[load.engine] = load
        self._sent[load.engine] = 0.0

    def estimate(self, engine: str) -> float:
        """The engine's outstanding work as the placer sees it."""
        return self._reports[engine].outstanding_s + self._sent.get(engine, 0.0)

    def fresh(self, now: float) -> list[EngineLoad]:
        """Reports young enough to trust, of engines that own partitions."""
        return [
            load
            for load in self._reports.values()
            if now - load.at <= self.expiry and load.partitions
        ]

    def choose(
        self,
        key: bytes,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        template: str | None = None,
    ) -> int:
        """The partition for a relQuery of these tokens (its output budget, all rows
        together; its key for the fallback), its work counted as sent to its engine."""
        choice = self.pick(prompt_tokens, output_tokens, now, template)
        return hash_partition(key, self.partitions) if choice is None else choice.partition

    def pick(
        self,
        prompt_tokens: int,
        output_tokens: int,
        now: float,
        template: str | None = None,
        prefer: str | None = None,
    ) -> Choice | None:
        """The engine and partition for a relQuery, its work counted as sent there; None
        with no fresh report. `prefer` (an engine's name) wins among the tied engines: a
        door that is itself an engine keeps its relQuery rather than send it away."""
        loads = self.fresh(now)
        if not loads:
            return None
        least = min(self.estimate(load.engine) for load in loads)
        bound = least * (1 + self.margin)
        tied = [load for load in loads if self.estimate(load.engine) <= bound]
        warm = [load for load in tied if template is not None and template in load.templates]
        mine = [load for load in tied if load.engine == prefer]
        chosen = min(
            mine or warm or tied, key=lambda load: (self.estimate(load.engine), load.engine)
        )
        work = chosen.work(prompt_tokens, output_tokens)
        self._sent[chosen.engine] = self._sent.get(chosen.engine, 0.0) + work
        turn = self._turn.get(chosen.engine, 0)
        self._turn[chosen.engine] = turn + 1
        return Choice(chosen.engine, chosen.partitions[turn % len(chosen.partitions)])
