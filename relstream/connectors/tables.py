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
    lines: tuple[int, ...] = ()  # each row's line in its file, for errors naming it


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


def undecodable(path: Path, encoding: str, exc: UnicodeDecodeError) -> str:
    """A decoding error told by the file's line and column (the codec's own position is
    within whatever chunk it was reading), with the option that fixes it."""
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode(encoding)
            except UnicodeDecodeError as bad:
                return (
                    f"{path}:{number}: not {encoding} text (byte 0x{line[bad.start]:02x} at "
                    f"column {bad.start + 1}); give the file's encoding with --encoding "
                    "(cp1252 and latin-1 are common)"
                )
    return f"{path}: not {encoding} text ({exc.reason}); give its encoding with --encoding"


def text_encoding(encoding: str) -> str:
    """The codec to open a file with: UTF-8 drops a byte order mark, as spreadsheet
    exports write one."""
    import codecs

    return "utf-8-sig" if codecs.lookup(encoding).name == "utf-8" else encoding


def load_csv(
    path: str | Path, name: str | None = None, delimiter: str | None = None, encoding="utf-8"
) -> Table:
    """Load a CSV with a header row, its delimiter read from the header unless given; a
    byte order mark (as spreadsheet exports write) is dropped. Text that is not in
    `encoding` is refused naming its line.

    The row key is the first column when its header is empty (an exported index), else
    the 1-based line number. Cells written as "<column>: <value>" lose that prefix.
    """
    path = Path(path)
    try:
        return _load_csv(path, name, delimiter, text_encoding(encoding))
    except UnicodeDecodeError as exc:
        raise ValueError(undecodable(path, encoding, exc)) from None


def _load_csv(path: Path, name: str | None, delimiter: str | None, encoding: str) -> Table:
    with path.open(newline="", encoding=encoding) as handle:
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
        lines: list[int] = []
        for line_number, cells in enumerate(reader, start=2):
            if not cells:
                continue
            if len(cells) != len(header):
                raise ValueError(
                    f"{path}:{line_number}: {len(cells)} fields, header has {len(header)}"
                )
            key = cells[0] if keyed else str(line_number - 1)
            values = cells[1:] if keyed else cells
            lines.append(line_number)
            rows.append(
                Row(
                    key,
                    {
                        col: _strip_column_prefix(col, v)
                        for col, v in zip(columns, values, strict=True)
                    },
                )
            )
    return Table(name or path.stem, columns, tuple(rows), tuple(lines))
