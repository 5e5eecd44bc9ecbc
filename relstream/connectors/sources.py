"""Sources: tables read row by row into row messages for a rows topic."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relstream.tables import load_csv

FORMATS = ("csv", "jsonl")


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    if suffix in ("csv", "tsv"):
        return "csv"
    if suffix in ("jsonl", "ndjson"):
        return "jsonl"
    raise ValueError(f"{path}: unknown format {suffix!r}; use one of {', '.join(FORMATS)}")


def read_rows(path: Path, table: str, key_column: str | None = None) -> Iterator[dict[str, Any]]:
    """Row messages for each row of a CSV or JSONL file (JSONL: one object per line)."""
    fmt = detect_format(path)
    if fmt == "csv":
        for row in load_csv(path, table).rows:
            values = dict(row.values)
            key = str(values[key_column]) if key_column else row.key
            yield {"version": 1, "table": table, "key": key, "values": values}
        return
    with path.open(encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                values = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_number}: not JSON ({exc.msg})") from None
            if not isinstance(values, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object per line")
            key = str(values[key_column]) if key_column else str(line_number)
            yield {"version": 1, "table": table, "key": key, "values": values}
