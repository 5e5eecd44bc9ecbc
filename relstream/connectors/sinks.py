"""Sinks: result messages → a JSONL file, a CSV file, or a PostgreSQL table.

Results arrive at least once; every sink writes a relQuery id once, so replays are
harmless. File sinks append one line (JSONL) or one line per row (CSV).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Protocol

import msgspec

from relstream.schemas import ResultMessage

LATENCY_PARTS = ("queued", "waiting", "core", "tail", "total")
CSV_COLUMNS = ("relquery_id", "row_key", "status", "output", "error", *LATENCY_PARTS)


def _latency_parts(result: ResultMessage) -> list[float | None]:
    latency = result.latency
    return [getattr(latency, part) if latency else None for part in LATENCY_PARTS]


class Sink(Protocol):
    def write(self, result: ResultMessage) -> bool:
        """Store a result; False when its relQuery id was already stored."""

    def close(self) -> None: ...


class JsonlSink:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._seen: set[str] = set()
        if self.path.exists():
            with self.path.open(encoding="utf-8") as handle:
                self._seen = {json.loads(line)["id"] for line in handle if line.strip()}
        self._handle = self.path.open("a", encoding="utf-8")

    def write(self, result: ResultMessage) -> bool:
        if result.id in self._seen:
            return False
        self._handle.write(msgspec.json.encode(result).decode() + "\n")
        self._handle.flush()
        self._seen.add(result.id)
        return True

    def close(self) -> None:
        self._handle.close()


class CsvSink:
    """One line per row of each result, with the relQuery's latency breakdown."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._seen: set[str] = set()
        new = not self.path.exists()
        if not new:
            with self.path.open(newline="", encoding="utf-8") as handle:
                self._seen = {row["relquery_id"] for row in csv.DictReader(handle)}
        self._handle = self.path.open("a", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._handle, CSV_COLUMNS)
        if new:
            self._writer.writeheader()

    def write(self, result: ResultMessage) -> bool:
        if result.id in self._seen:
            return False
        latency = _latency_parts(result)
        for row in result.rows:
            self._writer.writerow(
                {
                    "relquery_id": result.id,
                    "row_key": row.key,
                    "status": row.status,
                    "output": row.output,
                    "error": row.error,
                    **dict(zip(LATENCY_PARTS, latency, strict=True)),
                }
            )
        self._handle.flush()
        self._seen.add(result.id)
        return True

    def close(self) -> None:
        self._handle.close()


class PostgresSink:
    """Rows of results in a table keyed by (relquery_id, row_key); re-deliveries are
    ignored by the primary key (INSERT ... ON CONFLICT DO NOTHING)."""

    def __init__(self, dsn: str, table: str = "relstream_results") -> None:
        import psycopg
        from psycopg import sql

        self._sql = sql
        self.table = sql.Identifier(table)
        self._conn = psycopg.connect(dsn, autocommit=False)
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
            # Tables made before latency had a queued component gain the column.
            cursor.execute(
                sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS queued double precision").format(
                    self.table
                )
            )
        self._conn.commit()

    def write(self, result: ResultMessage) -> bool:
        parts = _latency_parts(result)
        statement = self._sql.SQL(
            "INSERT INTO {} (relquery_id, row_key, row_index, status, output, error,"
            " queued, waiting, core, tail, total, policy, model)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
            " ON CONFLICT DO NOTHING"
        ).format(self.table)
        inserted = 0
        with self._conn.cursor() as cursor:
            for index, row in enumerate(result.rows):
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
                    ),
                )
                inserted += cursor.rowcount
        self._conn.commit()
        return inserted > 0

    def close(self) -> None:
        self._conn.close()


def open_sink(target: str) -> Sink:
    """A sink for a target: postgresql://... or a .jsonl / .csv path."""
    if target.startswith(("postgresql://", "postgres://")):
        return PostgresSink(target)
    path = Path(target)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return JsonlSink(path)
    if path.suffix.lower() == ".csv":
        return CsvSink(path)
    raise ValueError(f"{target}: a sink is a .jsonl or .csv path, or a postgresql:// URL")
