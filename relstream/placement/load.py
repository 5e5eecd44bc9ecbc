"""The load an engine reports: what it has yet to do, as its scheduler prices it.

One type carries it from where it is measured to where it is weighed: the policy's
`load(view)` (`scheduler/policies.py`), the plug-in's file in vLLM's engine core
(`engine/core/loadwriter.py`) and the runtime's read of it (`engine/tags.py`), a
backend's `load()` (the vLLM runtime's, the simulator's), the report on the wire
(`LoadReportMessage`, `placement/reports.py`) and the placer's choice
(`placement/choice.py`). Pure: no engine, no Kafka client, so the scheduler, the
simulator and vLLM's engine core import it.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Iterable

import msgspec

SIZE_CLASSES = 16  # a report counts relQueries in at most this many size classes
SMALLEST_CLASS_S = 2.0**-8  # class k: from 2**k times this to twice that (class 0: from 0)
CHARS_PER_TOKEN = 4  # a prompt's tokens, estimated from its characters
RECENT_TEMPLATES = 8  # templates a load report names


class Load(msgspec.Struct, frozen=True):
    """An engine's outstanding work in engine seconds (its relQueries together, from its
    cost fit), what a prompt token and an output token cost it, its unfinished relQueries
    counted by size class of their work (`size_counts`: a relQuery is placed where it
    delays the fewest larger), the templates it served lately, newest first (its
    backend's; a policy knows none), and its work by priority class where any is not of
    class 0 (`class_work`: (class, engine seconds), highest first; empty: all class 0)."""

    outstanding_s: float
    per_prompt_token_s: float = 0.0
    per_output_token_s: float = 0.0  # its step shared by the batch
    size_counts: tuple[int, ...] = ()
    templates: tuple[str, ...] = ()
    class_work: tuple[tuple[int, float], ...] = ()

    def ahead_of(self, priority: int) -> float:
        """Engine seconds of its work a relQuery of class `priority` waits behind: that
        of its class and above, as a lower class gives way to it (`scheduler.classes`)."""
        if not self.class_work:
            return self.outstanding_s if priority <= 0 else 0.0
        return sum(work for level, work in self.class_work if level >= priority)

    @property
    def idle(self) -> bool:
        """No work left: such a report changes rarely, so its engine repeats it only as a
        heartbeat (`reports.LOAD_HEARTBEAT_S`) and readers trust it longer."""
        return self.outstanding_s <= 0 and not any(self.size_counts)

    @property
    def counted(self) -> bool:
        """Whether it counts its relQueries by size: one with work left and no counts
        comes from an engine that does not count them."""
        return bool(self.size_counts) or self.outstanding_s <= 0

    def work(self, prompt_tokens: int, output_tokens: int) -> float:
        """Engine seconds a relQuery of these tokens adds to this engine."""
        return self.per_prompt_token_s * prompt_tokens + self.per_output_token_s * output_tokens


def size_class(work_s: float) -> int:
    """The size class of a relQuery with `work_s` engine seconds left: its power of two,
    class 0 for under 1/128 s, the last class for 128 s and more."""
    if work_s < 2 * SMALLEST_CLASS_S:
        return 0
    if not math.isfinite(work_s) or work_s >= SMALLEST_CLASS_S * 2 ** (SIZE_CLASSES - 1):
        return SIZE_CLASSES - 1  # and a work no fit should give (inf, NaN): not a crash
    return math.floor(math.log2(work_s / SMALLEST_CLASS_S))


def size_counts(works: Iterable[float]) -> tuple[int, ...]:
    """How many relQueries of these works fall in each size class, up to the last
    class that holds one."""
    counts = [0] * SIZE_CLASSES
    for work in works:
        counts[size_class(work)] += 1
    while counts and not counts[-1]:
        counts.pop()
    return tuple(counts)


def class_work(works: Iterable[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """(class, work) pairs summed by class, highest first; empty where all are class 0."""
    sums: dict[int, float] = {}
    for level, work in works:
        sums[level] = sums.get(level, 0.0) + work
    return () if set(sums) <= {0} else tuple(sorted(sums.items(), reverse=True))


def counted_load(
    outstanding_s: float, per_prompt_token_s: float, per_output_token_s: float,
    works: list[tuple[int, float]],
) -> Load:  # fmt: skip
    """A policy's load: its work and prices, its relQueries counted by size class and
    their work summed by class from each one's (class, work)."""
    counts = size_counts(work for _, work in works)
    return Load(outstanding_s, per_prompt_token_s, per_output_token_s, counts,
                class_work=class_work(works))  # fmt: skip


def template_id(text: str) -> str:
    """A template's short id in load reports: its text's CRC-32 (a template may be 64 KB)."""
    return f"{zlib.crc32(text.encode()):08x}"


class RecentTemplates:
    """Ids of the templates an engine served lately, newest first, at most
    RECENT_TEMPLATES (a placer prefers an engine whose prefix cache holds one)."""

    def __init__(self) -> None:
        self._ids: deque[str] = deque(maxlen=RECENT_TEMPLATES)

    def note(self, text: str) -> None:
        tid = template_id(text)
        if tid in self._ids:
            self._ids.remove(tid)
        self._ids.appendleft(tid)

    def ids(self) -> tuple[str, ...]:
        return tuple(self._ids)
