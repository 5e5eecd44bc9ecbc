"""Engine core: the plug-in's writer of its policy's load, out of vLLM's engine core.

The policy that knows an engine's outstanding work runs inside the engine core (the
plug-in, `engine/core/plugin.py`), a process of its own; the load report is published
by the engine service in the service's process (`placement/reports.py`). The plug-in
writes its policy's load to a small file every `WRITE_EVERY_S` seconds and whenever it
runs out of work, replacing it whole (a reader never sees half a record), and the
runtime reads the latest when the service reports (`engine/tags.py`: the record and its
reader). A file, not a pipe: the writer never blocks on a reader, and a reader that is
late only reads an older load. This is the engine core's side of placement by load
(`relstream.placement`, where the `Load` it writes is defined).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from relstream.engine.tags import load_record
from relstream.placement.load import Load

WRITE_EVERY_S = 0.1  # the plug-in's writes at most this often (a report is every 0.25 s)
MAX_SHARE = 0.05  # of the scheduler's thread spent pricing the load, at most


class LoadWriter:
    """One engine's load file, as the plug-in writes it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._written_at = -float("inf")
        self._period = WRITE_EVERY_S
        self._idle = False  # the last write said no work was left

    def due(self, now: float, idle: bool) -> bool:
        """Whether a writer should write now: a period has passed, or the engine has just
        run out of work (so no stale load outlives it while nothing steps)."""
        return now - self._written_at >= self._period or (idle and not self._idle)

    def write(self, load: Load, took_s: float = 0.0, idle: bool = False) -> bool:
        """Replace the load; False where the file could not be written (a full or
        removed folder): a report is best effort, and the scheduler must not fail for it.
        `took_s`, what pricing the load took, stretches the period so that pricing takes
        at most MAX_SHARE of the writer's time (a policy that walks every relQuery it
        holds, thousands of them). An `idle` engine core (no request left) has no work
        and no relQueries, whatever its policy still prices: only its prices are kept."""
        if idle:
            load = msgspec.structs.replace(load, outstanding_s=0.0, size_counts=())
        now = time.monotonic()
        self._period = max(WRITE_EVERY_S, took_s / MAX_SHARE)
        record = load_record(now, load)
        partial = self.path.with_name(self.path.name + ".partial")
        self._written_at = now
        try:
            partial.write_bytes(record)
            os.replace(partial, self.path)
        except OSError:
            return False
        self._idle = load.outstanding_s <= 0.0
        return True
