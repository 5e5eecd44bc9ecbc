"""Both processes: what the service and the plug-in in vLLM's engine core agree on.

The runtime (`engine/runtime.py`, in the service's process) starts vLLM with the plug-in
(`engine/core/plugin.py`, in vLLM's engine core process) and talks to it only through
vLLM: the plug-in's class path and its settings in the engine arguments, each request's
tags in its sampling parameters, and back the policy's load (`placement/load.py`) in a
small file (`engine/core/loadwriter.py` writes it). Both sides import this module and
neither imports the other's, so the engine core never loads the service's code nor the
service the scheduler's.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import msgspec

from relstream.placement.load import Load
from relstream.wire.windowid import WindowId

# The engine arg `scheduler_cls`: a dotted path vLLM imports in its engine core process.
PLUGIN_CLASS = "relstream.engine.core.plugin.relstream_scheduler"
SETTINGS_KEY = "relstream"  # the plug-in's settings: vLLM's additional_config[SETTINGS_KEY]
EXTRA_ARGS_KEY = "relstream"  # SamplingParams.extra_args[EXTRA_ARGS_KEY] = {...}


def relquery_tags(
    relquery_id: str,
    size: int,
    deadline_in: float | None = None,
    share: str | None = None,
    priority: int = 0,
) -> dict[str, Any]:
    """What a request must carry in `SamplingParams.extra_args` to be grouped, its
    relQuery's deadline in seconds from now (relative, so no clock is shared), the key it
    shares with identical requests of other relQueries (one runs for all), its
    relQuery's class (`scheduler.classes`), and the registered query its relQuery is a
    window of, read from the id (`scheduler.fairshare`)."""
    tags: dict[str, Any] = {"relquery_id": relquery_id, "relquery_size": size}
    query = window_query(relquery_id)
    if query is not None:
        tags["query"] = query
    if priority:
        tags["priority"] = priority
    if deadline_in is not None:
        tags["deadline_in_s"] = deadline_in
    if share is not None:
        tags["share"] = share
    return {EXTRA_ARGS_KEY: tags}


@functools.lru_cache(maxsize=256)
def window_query(relquery_id: str) -> str | None:
    """The registered query a window's relQuery id names (None: not a window's), read
    once per relQuery, not once per row: every row's request is tagged."""
    window = WindowId.parse(relquery_id)
    return None if window is None else window.query


def load_record(at: float, load: Load) -> bytes:
    """The load file's record: the policy's load (`Policy.load`) and when it was measured
    (`time.monotonic`, one clock for every process on the machine)."""
    return msgspec.json.encode((at, load))


def read_load(path: Path) -> tuple[float, Load] | None:
    """When the plug-in last wrote its load to `path`, and the load; None before the first
    write (or if it cannot be read: the runtime then reports nothing, and the placer falls
    back to the hash). The writer replaces the file whole, so a read never sees half a
    record."""
    try:
        return msgspec.json.decode(path.read_bytes(), type=tuple[float, Load])
    except (OSError, msgspec.DecodeError):
        return None
