"""PostgreSQL as the connectors reach it: a connection, or one line naming where it could
not be made (a 38-line psycopg traceback said less, issue 49)."""

from __future__ import annotations

from urllib.parse import urlsplit


class PostgresUnavailable(ConnectionError):
    """PostgreSQL could not be reached, or refused the login or the connection."""


def where(dsn: str) -> str:
    """host:port/database of a postgresql:// URL, without user or password."""
    parts = urlsplit(dsn)
    host = parts.hostname or "localhost"
    return f"{host}:{parts.port or 5432}{parts.path or ''}"


def first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def connect(dsn: str, **options):
    """`psycopg.connect`, or PostgresUnavailable in one line naming the server."""
    import psycopg

    try:
        return psycopg.connect(dsn, **options)
    except psycopg.OperationalError as exc:
        raise PostgresUnavailable(
            f"could not connect to PostgreSQL at {where(dsn)}: {first_line(exc)}"
        ) from None
