"""Sources: tables read row by row into row messages for a rows topic."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relstream.connectors.postgres import connect, first_line
from relstream.connectors.tables import load_csv, text_encoding, undecodable
from relstream.wire import MessageError, RowMessage, checked, encode
from relstream.wire.messages import MAX_ROW_BYTES

FORMATS = ("csv", "jsonl", "parquet")


def detect_format(path: Path) -> str:
    suffix = path.suffix.lower().lstrip(".")
    if suffix in ("csv", "tsv"):
        return "csv"
    if suffix in ("jsonl", "ndjson"):
        return "jsonl"
    if suffix in ("parquet", "pq"):
        return "parquet"
    raise ValueError(f"{path}: unknown format {suffix!r}; use one of {', '.join(FORMATS)}")


def _row(table: str, key: str, values: dict[str, Any], where: str) -> RowMessage:
    """The row message, checked as the worker will check it (its size too), so a bad row
    is refused, named by `where` (its file and line), before anything is produced."""
    try:
        row = checked(RowMessage(table=table, key=key, values=values))
    except MessageError as exc:
        raise ValueError(f"{where}: row {key!r}: {exc.reason}") from None
    size = len(encode(row))
    if size > MAX_ROW_BYTES:  # the worker would only dead-letter it
        raise ValueError(
            f"{where}: row {key!r} is {size:,} bytes encoded; a row is at most {MAX_ROW_BYTES:,}"
        )
    return row


def _scalar(value: Any) -> Any:
    """Row values are scalars on the wire; a nested value travels as its JSON text (a
    date or a decimal as its own text). A NaN is a missing value (as pandas writes one),
    so null: the wire refuses NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


def _key(values: dict[str, Any], key_column: str, where: str) -> str:
    """The row's key from `key_column`, or an error naming the columns found."""
    try:
        return str(values[key_column])
    except KeyError:
        found = ", ".join(repr(column) for column in values) or "none"
        raise ValueError(
            f"{where}: no key column {key_column!r}; the columns are {found}"
        ) from None


def read_rows(
    path: Path,
    table: str,
    key_column: str | None = None,
    empty_strings: bool = False,
    delimiter: str | None = None,
    encoding: str = "utf-8",
) -> Iterator[RowMessage]:
    """Row messages for each row of a CSV, JSONL (one object per line) or Parquet file.

    An empty CSV cell is null, as in a database export (a row whose template column is
    null is answered with status "null", never asked of the model), unless
    `empty_strings` keeps it as the empty string. A key cell is never null: an empty key
    is refused naming the row. A CSV's delimiter is read from its header unless given;
    text files are read in `encoding`.

    One rule for every format: a bad row (unreadable, wrong fields, refused by the wire's
    checks, too large) raises naming its line, so a caller that reads every row before
    sending any sends nothing from a file with a bad row."""
    fmt = detect_format(path)
    if fmt == "parquet":
        import pyarrow.parquet as pq

        for index, values in enumerate(pq.read_table(path).to_pylist(), start=1):
            values = {column: _scalar(v) for column, v in values.items()}
            key = _key(values, key_column, f"{path} row {index}") if key_column else str(index)
            yield _row(table, key, values, f"{path} row {index}")
        return
    if fmt == "csv":
        loaded = load_csv(path, table, delimiter, encoding)
        for row, line in zip(loaded.rows, loaded.lines, strict=True):
            key = _key(row.values, key_column, str(path)) if key_column else row.key
            values = {
                column: None if value == "" and not empty_strings else value
                for column, value in row.values.items()
            }
            yield _row(table, key, values, f"{path}:{line}")
        return
    try:
        yield from _jsonl_rows(path, table, key_column, text_encoding(encoding))
    except UnicodeDecodeError as exc:
        raise ValueError(undecodable(path, encoding, exc)) from None


def _jsonl_rows(
    path: Path, table: str, key_column: str | None, encoding: str
) -> Iterator[RowMessage]:
    with path.open(encoding=encoding) as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                values = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_number}: not JSON ({exc.msg})") from None
            if not isinstance(values, dict):
                raise ValueError(f"{path}:{line_number}: expected a JSON object per line")
            where = f"{path}:{line_number}"
            key = _key(values, key_column, where) if key_column else str(line_number)
            yield _row(table, key, {c: _scalar(v) for c, v in values.items()}, where)


def read_query(
    dsn: str, query: str, table: str, key_column: str | None = None
) -> Iterator[RowMessage]:
    """Row messages for each row a PostgreSQL query returns, streamed with a server-side
    cursor so a large result never sits in memory whole."""
    import psycopg

    with connect(dsn) as conn, conn.cursor(name="relstream_source") as cursor:
        try:
            cursor.execute(query)
        except psycopg.Error as exc:  # the query's own fault: one line, as a bad row
            raise ValueError(f"PostgreSQL refused --query: {first_line(exc)}") from None
        columns = [column.name for column in cursor.description]
        for index, record in enumerate(cursor, start=1):
            values = {c: _scalar(v) for c, v in zip(columns, record, strict=True)}
            key = str(values[key_column]) if key_column else str(index)
            yield _row(table, key, values, f"query row {index}")
