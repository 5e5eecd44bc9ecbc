"""Between wire messages and the domain model."""

from __future__ import annotations

import time
from typing import Any

from relstream.model import LatencyBreakdown, RelQuery, Row, Template, TemplateError
from relstream.schemas import MessageError


def relquery_from_message(message: dict[str, Any]) -> RelQuery:
    """A validated relquery message as a RelQuery; a bad template is a MessageError."""
    try:
        template = Template(message["template"])
    except TemplateError as exc:
        raise MessageError("relquery", f"field template: {exc}") from None
    rows = [Row(row["key"], row["values"]) for row in message["rows"]]
    return RelQuery(
        id=message["id"],
        template=template,
        rows=rows,
        max_output_tokens=message["max_output_tokens"],
        system_prompt=message.get("system_prompt"),
        arrival_time=message["submitted_at"],
    )


def relquery_message(relquery: RelQuery, submitted_at: float | None = None) -> dict[str, Any]:
    return {
        "version": 1,
        "id": relquery.id,
        "template": relquery.template.text,
        "rows": [{"key": row.key, "values": dict(row.values)} for row in relquery.rows],
        "system_prompt": relquery.system_prompt,
        "max_output_tokens": relquery.max_output_tokens,
        "submitted_at": time.time() if submitted_at is None else submitted_at,
    }


def row_payload(row) -> dict[str, Any]:
    """One row of a result (an engine RowResult) as it goes on the wire."""
    return {"key": row.row_key, "status": row.status, "output": row.output, "error": row.error}


def result_message(
    relquery_id: str, rows: list, latency: LatencyBreakdown | None, policy: str, model: str
) -> dict[str, Any]:
    return {
        "version": 1,
        "id": relquery_id,
        "rows": [row_payload(row) for row in rows],
        "latency": latency.as_dict() if latency else None,
        "policy": policy,
        "model": model,
        "completed_at": time.time(),
    }
