"""The way an engine's load gets out of vLLM's engine core process.

The policy that knows an engine's outstanding work runs inside the engine core (the
plug-in, `engine/plugin.py`), a process of its own; the load report is published by
the engine service in the front process (`service/loadreport.py`). The plug-in writes
its policy's load to a small file every `WRITE_EVERY_S` seconds and whenever it runs out
of work, replacing it whole (a reader never sees half a record), and the runtime reads
the latest when the service reports. A file, not a pipe: the writer never blocks on a
reader, and a reader that is late only reads an older load.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

WRITE_EVERY_S = 0.1  # the plug-in's writes at most this often (a report is every 0.25 s)
MAX_SHARE = 0.05  # of the scheduler's thread spent pricing the load, at most


class CoreLoad(msgspec.Struct, frozen=True):
    """The policy's load (`Policy.load`) and when it was measured (`time.monotonic`,
    one clock for every process on the machine)."""

    outstanding_s: float
    per_prompt_token_s: float
    per_output_token_s: float
    at: float
    size_counts: tuple[int, ...] = ()  # its relQueries per size class (Policy.load)


class LoadFile:
    """One engine's load, written by the plug-in and read by the runtime."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._written_at = -float("inf")
        self._period = WRITE_EVERY_S
        self._idle = False  # the last write said no work was left

    def due(self, now: float, idle: bool) -> bool:
        """Whether a writer should write now: a period has passed, or the engine has just
        run out of work (so no stale load outlives it while nothing steps)."""
        return now - self._written_at >= self._period or (idle and not self._idle)

    def write(
        self,
        outstanding_s: float,
        per_prompt: float,
        per_output: float,
        size_counts: tuple[int, ...] = (),
        took_s: float = 0.0,
    ) -> bool:
        """Replace the load; False where the file could not be written (a full or
        removed folder): a report is best effort, and the scheduler must not fail for it.
        `took_s`, what pricing the load took, stretches the period so that pricing takes
        at most MAX_SHARE of the writer's time (a policy that walks every relQuery it
        holds, thousands of them)."""
        now = time.monotonic()
        self._period = max(WRITE_EVERY_S, took_s / MAX_SHARE)
        load = CoreLoad(outstanding_s, per_prompt, per_output, now, size_counts)
        record = msgspec.json.encode(load)
        partial = self.path.with_name(self.path.name + ".partial")
        self._written_at = now
        try:
            partial.write_bytes(record)
            os.replace(partial, self.path)
        except OSError:
            return False
        self._idle = outstanding_s <= 0.0
        return True

    def read(self) -> CoreLoad | None:
        """The latest load written; None before the first write (or if it cannot be read:
        a reader then reports nothing, and the placer falls back to the hash)."""
        try:
            return msgspec.json.decode(self.path.read_bytes(), type=CoreLoad)
        except (OSError, msgspec.DecodeError):
            return None
