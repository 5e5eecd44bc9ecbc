"""Ready files: how a relstream process says it serves. `relstream engine` and
`relstream worker --ready-file PATH` write one once they take work (the engine: model
loaded, answer cache read, its group joined; the worker: every window stage in its
group), and remove it at start and on a clean stop. The launcher, the demo, the lab and
container healthchecks all wait on these files, never on log text."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path


def mark_ready(path: str | os.PathLike, says: str) -> None:
    """Write `path` atomically (a temporary file renamed over it), so a reader never sees
    it half written."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(says if says.endswith("\n") else f"{says}\n")
    os.replace(temporary, path)


def clear_ready(path: str | os.PathLike | None) -> None:
    """Remove `path`, if any: a restarted process (or container) keeps the last run's."""
    if path is not None:
        Path(path).unlink(missing_ok=True)


async def mark_ready_when(joined: asyncio.Event, path: str | os.PathLike | None, says: str) -> None:
    """Write `path` (if given) once `joined` is set: a consumer's group joined."""
    await joined.wait()
    if path is not None:
        mark_ready(path, says)
