"""A file sink's stored length, so a crash or a full disk never leaves part of a result
counted as stored (issue 48, item 8).

A file sink appends whole results, but an append can be cut: the process killed mid-write,
the disk full. Its journal (`<file>.stored`, beside it) holds the file's length after the
last whole result that was made durable: `commit` flushes the file, fsyncs it, then
replaces the journal atomically, and the caller lets its consumer group commit only after.
At start, and where a write failed, whatever lies past that length is cut: results
written since the last commit were not acknowledged to the broker, so they come again.
A sink that closes cleanly commits what it wrote whole first (those results come again
too, and are known by their ids).
A file with no journal (written by a release before it, or by hand) is kept as it is,
less a last line that does not end.
"""

from __future__ import annotations

import os
from pathlib import Path

SUFFIX = ".stored"


class FileJournal:
    """The committed length of the file at `path`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.journal = self.path.with_name(self.path.name + SUFFIX)

    def committed(self) -> int | None:
        """The length last committed, or None where there is no journal."""
        try:
            return int(self.journal.read_text(encoding="ascii").strip())
        except FileNotFoundError:
            return None
        except ValueError:  # a journal cut mid-write cannot be: it is replaced whole
            return None

    def cut(self) -> int:
        """Cut the file back to its committed length (with no journal: to its last line
        end); returns the bytes cut."""
        if not self.path.exists():
            return 0
        size = self.path.stat().st_size
        keep = self.committed()
        if keep is None:
            keep = _last_line_end(self.path, size)
        if size <= keep:
            return 0
        with self.path.open("r+b") as handle:
            handle.truncate(keep)
            handle.flush()
            os.fsync(handle.fileno())
        return size - keep

    def forget(self) -> None:
        """Remove the journal (the file is about to be replaced whole)."""
        self.journal.unlink(missing_ok=True)

    def commit(self, handle) -> None:
        """Make what `handle` wrote durable, then record the file's length."""
        handle.flush()
        os.fsync(handle.fileno())
        length = os.fstat(handle.fileno()).st_size
        fresh = self.journal.with_name(self.journal.name + ".new")
        with fresh.open("w", encoding="ascii") as out:
            out.write(f"{length}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(fresh, self.journal)


def _last_line_end(path: Path, size: int) -> int:
    """The length up to and including the file's last newline (0: none)."""
    if size == 0:
        return 0
    with path.open("rb") as handle:
        position = size
        while position > 0:
            step = min(65536, position)
            handle.seek(position - step)
            chunk = handle.read(step)
            at = chunk.rfind(b"\n")
            if at >= 0:
                return position - step + at + 1
            position -= step
    return 0
