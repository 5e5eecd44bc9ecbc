"""Rows → relQueries: validation of each row and the relQuery built from a window.

Kept free of Faust so the rules are tested directly; the Faust app only feeds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from relstream.schemas import MessageError, RelQueryMessage, RelQueryRow, RowMessage, decode
from relstream.stream.registrations import QueryRegistration

MAX_ROW_BYTES = 256 * 1024  # a row larger than this is refused, not windowed


@dataclass(frozen=True)
class RowRejection:
    reason: str


def check_row(registration: QueryRegistration, raw: bytes | None) -> RowMessage | RowRejection:
    """A row message usable by this registration, or why it is not."""
    if raw is not None and len(raw) > MAX_ROW_BYTES:
        return RowRejection(f"row is {len(raw)} bytes; the limit is {MAX_ROW_BYTES}")
    try:
        row = decode(RowMessage, raw)
    except MessageError as exc:
        return RowRejection(str(exc))
    if row.table != registration.table:
        return RowRejection(
            f"row of table {row.table!r} on the topic of table {registration.table!r}"
        )
    missing = [c for c in registration.template.columns if c not in row.values]
    if missing:
        names = ", ".join("{" + c + "}" for c in missing)
        return RowRejection(
            f"row {row.key!r} lacks column(s) {names} that query {registration.name!r} uses"
        )
    return row


def relquery_for_window(
    registration: QueryRegistration, rows: list[RowMessage], window_id: str
) -> RelQueryMessage:
    """The relquery message for one window's rows. `window_id` must be the same when the
    window is replayed after a crash, so consumers can de-duplicate on the id."""
    return RelQueryMessage(
        id=f"{registration.name}-{window_id}",
        template=registration.template.text,
        rows=[RelQueryRow(key=row.key, values=row.values) for row in rows],
        system_prompt=registration.system_prompt,
        max_output_tokens=registration.max_output_tokens,
        submitted_at=time.time(),
    )
