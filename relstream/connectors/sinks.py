"""Sinks: result messages → a JSONL file, a CSV file, or a PostgreSQL table.

Results arrive at least once; every sink writes a relQuery id once, so replays are
harmless. File sinks append one line (JSONL) or one line per row (CSV). Each carries the
query a result answers (`query`, from a window's id; empty for other relQueries) and,
given `inputs` (`relstream sink --with-input`), each row's input values: an `input`
object per row (JSONL), `input.<column>` columns (CSV; the header widens when a result
brings a column it lacks), an `input` jsonb column (PostgreSQL).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import msgspec

from relstream.connectors.joins import input_values
from relstream.connectors.journal import FileJournal
from relstream.connectors.postgres import PostgresUnavailable, connect, first_line, where
from relstream.wire import ResultMessage
from relstream.wire.messages import RelQueryRow
from relstream.wire.windowid import WindowId

LATENCY_PARTS = ("queued", "waiting", "core", "tail", "total")
CSV_COLUMNS = ("relquery_id", "query", "row_key", "status", "output", "error", *LATENCY_PARTS)
INPUT_PREFIX = "input."  # a CSV column holding an input value: input.<column>

# A relQuery id -> its input rows (None where unknown): `inputs.RelQueryInputs.rows`.
Inputs = Callable[[str], list[RelQueryRow] | None]


def _latency_parts(result: ResultMessage) -> list[float | None]:
    latency = result.latency
    return [getattr(latency, part) if latency else None for part in LATENCY_PARTS]


class Sink(Protocol):
    def write(self, result: ResultMessage) -> bool:
        """Store a result; False when its relQuery id was already stored."""

    def sync(self) -> None:
        """Make every result written so far durable: called before its offsets commit."""

    def close(self) -> None: ...


class _JournalledFile:
    """What the file sinks share: appends of whole results under a `FileJournal`. A
    write cut by an error (a full disk) is cut from the file at once and again at the
    next start; `sync` commits the journal; `close` commits what was written whole."""

    def _open_journalled(self, path: Path) -> None:
        self.path = Path(path)
        self._journal = FileJournal(self.path)
        self._journal.cut()
        self._torn = False

    def _started(self) -> None:
        """The append handle is open: its length so far is committed."""
        self._journal.commit(self._handle)

    def _append_whole(self, text: str) -> None:
        try:
            self._handle.write(text)
            self._handle.flush()
        except OSError:
            self._abandon()
            raise

    def _abandon(self) -> None:
        """Cut what was written since the last commit (its offsets were not committed)."""
        with contextlib.suppress(OSError):
            self._handle.close()
        self._journal.cut()
        self._torn = True

    def sync(self) -> None:
        if self._torn:
            raise OSError(f"{self.path}: a write failed; the sink must start again")
        try:
            self._journal.commit(self._handle)
        except OSError:
            self._abandon()
            raise

    def close(self) -> None:
        if self._torn:
            return
        with contextlib.suppress(OSError):
            self._journal.commit(self._handle)
        self._handle.close()
        self._journal.cut()


class JsonlSink(_JournalledFile):
    """One line per result: the result message as JSON, with `query` and, given `inputs`,
    an `input` object in each row."""

    def __init__(self, path: Path, inputs: Inputs | None = None) -> None:
        self._open_journalled(path)
        self._inputs = inputs
        self._seen: set[str] = set()
        if self.path.exists():
            with self.path.open(encoding="utf-8") as handle:
                self._seen = {json.loads(line)["id"] for line in handle if line.strip()}
        self._handle = self.path.open("a", encoding="utf-8")
        self._started()

    def write(self, result: ResultMessage) -> bool:
        if result.id in self._seen:
            return False
        line = {"query": WindowId.query_of(result.id), **msgspec.to_builtins(result)}
        if self._inputs is not None:
            rows = self._inputs(result.id)
            for index, row in enumerate(line["rows"]):
                row["input"] = input_values(rows, index, row["key"])
        self._append_whole(msgspec.json.encode(line).decode() + "\n")
        self._seen.add(result.id)
        return True


class CsvSink(_JournalledFile):
    """One line per row of each result, with the relQuery's latency breakdown."""

    def __init__(self, path: Path, inputs: Inputs | None = None) -> None:
        self._open_journalled(path)
        self._inputs = inputs
        self._seen: set[str] = set()
        self.columns = list(CSV_COLUMNS)
        if self.path.exists() and self.path.stat().st_size:
            with self.path.open(newline="", encoding="utf-8") as handle:
                reader = csv.DictReader(handle)
                self._seen = {row["relquery_id"] for row in reader}
                written = list(reader.fieldnames or ())
            missing = [c for c in CSV_COLUMNS if c not in written]
            self._append(written)
            if missing:  # a file from a release before the `query` column
                self._widen(written + missing)
        else:
            with self.path.open("w", newline="", encoding="utf-8") as handle:
                csv.DictWriter(handle, self.columns).writeheader()
            self._append(self.columns)

    def _append(self, columns: list[str]) -> None:
        self.columns = columns
        self._handle = self.path.open("a", newline="", encoding="utf-8")
        self._started()

    def _widen(self, columns: list[str]) -> None:
        """Rewrite the file under a header with more columns (empty in earlier lines)."""
        self.sync()
        self._handle.close()
        with self.path.open(newline="", encoding="utf-8") as handle:
            kept = list(csv.DictReader(handle))
        wider = self.path.with_name(self.path.name + ".widening")
        with wider.open("w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, columns)
            writer.writeheader()
            writer.writerows(kept)
            handle.flush()
            os.fsync(handle.fileno())
        # Without a journal a file is kept whole: a crash between these two steps
        # leaves the old file or the widened one, never one cut at the other's length.
        self._journal.forget()
        os.replace(wider, self.path)
        self._append(columns)

    def write(self, result: ResultMessage) -> bool:
        if result.id in self._seen:
            return False
        latency = _latency_parts(result)
        inputs = self._inputs(result.id) if self._inputs is not None else None
        lines = []
        for index, row in enumerate(result.rows):
            line = {
                "relquery_id": result.id,
                "query": WindowId.query_of(result.id),
                "row_key": row.key,
                "status": row.status,
                "output": row.output,
                "error": row.error,
                **dict(zip(LATENCY_PARTS, latency, strict=True)),
            }
            values = input_values(inputs, index, row.key) or {}
            line.update({INPUT_PREFIX + name: value for name, value in values.items()})
            lines.append(line)
        new = list(dict.fromkeys(c for line in lines for c in line if c not in self.columns))
        if new:
            self._widen(self.columns + new)
        text = io.StringIO(newline="")
        csv.DictWriter(text, self.columns).writerows(lines)
        self._append_whole(text.getvalue())  # a result's rows in one write
        self._seen.add(result.id)
        return True


class PostgresSink:
    """Rows of results in a table keyed by (relquery_id, row_key); re-deliveries are
    ignored by the primary key (INSERT ... ON CONFLICT DO NOTHING)."""

    def __init__(
        self, dsn: str, table: str = "relstream_results", inputs: Inputs | None = None
    ) -> None:
        import psycopg
        from psycopg import sql

        self._sql = sql
        self.table = sql.Identifier(table)
        self._conn = connect(dsn, autocommit=False)
        self._lost, self._where = psycopg.OperationalError, where(dsn)  # for `write`
        with self._conn.cursor() as cursor:
            cursor.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} (relquery_id text NOT NULL,"
                    " row_key text NOT NULL, row_index integer NOT NULL,"
                    " status text NOT NULL, output text, error text,"
                    " waiting double precision, core double precision, tail double precision,"
                    " total double precision, policy text, model text,"
                    " PRIMARY KEY (relquery_id, row_key, row_index))"
                ).format(self.table)
            )
            # Tables made before latency had a queued component, or before results carried
            # their query and inputs, gain the columns.
            for column in ("queued double precision", "query text", "input jsonb"):
                cursor.execute(
                    sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS " + column).format(self.table)
                )
        self._conn.commit()
        self._inputs = inputs

    def write(self, result: ResultMessage) -> bool:
        try:
            return self._insert(result)
        except self._lost as exc:  # the server gone: a sink's `OSError`, in one line
            raise PostgresUnavailable(
                f"lost PostgreSQL at {self._where}: {first_line(exc)}"
            ) from None

    def _insert(self, result: ResultMessage) -> bool:
        parts = _latency_parts(result)
        statement = self._sql.SQL(
            "INSERT INTO {} (relquery_id, row_key, row_index, status, output, error,"
            " queued, waiting, core, tail, total, policy, model, query, input)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING"
        ).format(self.table)
        from psycopg.types.json import Jsonb

        query = WindowId.query_of(result.id)
        inputs = self._inputs(result.id) if self._inputs is not None else None
        inserted = 0
        with self._conn.cursor() as cursor:
            for index, row in enumerate(result.rows):
                values = input_values(inputs, index, row.key)
                cursor.execute(
                    statement,
                    (
                        result.id,
                        row.key,
                        index,
                        row.status,
                        row.output,
                        row.error,
                        *parts,
                        result.policy,
                        result.model,
                        query,
                        None if values is None else Jsonb(values),
                    ),
                )
                inserted += cursor.rowcount
        self._conn.commit()
        return inserted > 0

    def sync(self) -> None:
        """Nothing: each result is committed in its own database transaction."""

    def close(self) -> None:
        self._conn.close()


def open_sink(target: str, inputs: Inputs | None = None) -> Sink:
    """A sink for a target: postgresql://... or a .jsonl / .csv path; `inputs` adds each
    row's input values."""
    if target.startswith(("postgresql://", "postgres://")):
        return PostgresSink(target, inputs=inputs)
    path = Path(target)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return JsonlSink(path, inputs)
    if path.suffix.lower() == ".csv":
        return CsvSink(path, inputs)
    raise ValueError(f"{target}: a sink is a .jsonl or .csv path, or a postgresql:// URL")


def default_group(target: str) -> str:
    """The consumer group `relstream sink TARGET` reads results under unless told: one
    per target, the same on every run of it, so each sink of a pipeline stores every
    result (one group shared by all had the second sink store nothing) and a sink run
    again stores what came since. A file is known by its absolute path, a URL by itself
    less its password; the name shows the file's name (a URL's scheme) for `status`,
    then 8 hex digits of the SHA-256 of that path or URL."""
    if "://" in target:
        url = urlsplit(target)
        host = url.hostname or ""
        if url.port is not None:
            host = f"{host}:{url.port}"
        if url.username is not None:
            host = f"{url.username}@{host}"
        name, known = url.scheme, url._replace(netloc=host).geturl()
    else:
        path = Path(target).expanduser().resolve()
        name, known = path.name, str(path)
    digest = hashlib.sha256(known.encode()).hexdigest()[:8]
    return f"relstream-sink-{name}-{digest}"
