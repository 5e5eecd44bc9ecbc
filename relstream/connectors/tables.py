"""Reading tables from CSV into rows."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from relstream.model import Row

csv.field_size_limit(16 * 1024 * 1024)


@dataclass(frozen=True)
class Table:
    name: str
    columns: tuple[str, ...]
    rows: tuple[Row, ...]


def _strip_column_prefix(column: str, value: str) -> str:
    # LLM-SQL style exports write each cell as "<column>: <value>".
    prefix = f"{column}: "
    if value.startswith(prefix):
        return value[len(prefix) :]
    return "" if value == f"{column}:" else value


DELIMITERS = (",", ";", "\t", "|")


def header_delimiter(line: str) -> str:
    """The delimiter a header line uses: of , ; tab and |, the one it holds most of
    outside quotes (a comma on a tie or when it holds none)."""
    outside = []
    quoted = False
    for char in line:
        if char == '"':
            quoted = not quoted
        elif not quoted:
            outside.append(char)
    counts = {delimiter: outside.count(delimiter) for delimiter in DELIMITERS}
    best = max(DELIMITERS, key=lambda d: (counts[d], d == ","))
    return best if counts[best] else ","


def load_csv(path: str | Path, name: str | None = None, delimiter: str | None = None) -> Table:
    """Load a CSV with a header row, its delimiter read from the header unless given; a
    byte order mark (as spreadsheet exports write) is dropped.

    The row key is the first column when its header is empty (an exported index), else
    the 1-based line number. Cells written as "<column>: <value>" lose that prefix.
    """
    path = Path(path)
    with path.open(newline="", encoding="utf-8-sig") as handle:
        if delimiter is None:
            delimiter = header_delimiter(handle.readline())
            handle.seek(0)
        reader = csv.reader(handle, delimiter=delimiter)
        try:
            header = next(reader)
        except StopIteration:
            raise ValueError(f"{path}: empty file, expected a header row") from None
        keyed = header[0] == ""
        columns = tuple(header[1:] if keyed else header)
        rows: list[Row] = []
        for line_number, cells in enumerate(reader, start=2):
            if not cells:
                continue
            if len(cells) != len(header):
                raise ValueError(
                    f"{path}:{line_number}: {len(cells)} fields, header has {len(header)}"
                )
            key = cells[0] if keyed else str(line_number - 1)
            values = cells[1:] if keyed else cells
            rows.append(
                Row(
                    key,
                    {
                        col: _strip_column_prefix(col, v)
                        for col, v in zip(columns, values, strict=True)
                    },
                )
            )
    return Table(name or path.stem, columns, tuple(rows))
