"""Between wire messages and the domain model."""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from typing import Any

from relstream.model import (
    LatencyBreakdown,
    RelQuery,
    RelQueryResult,
    Row,
    RowResult,
    Template,
    TemplateError,
)
from relstream.outputspec import OutputKind, OutputSpec, OutputSpecError, Sampling
from relstream.wire.codec import MessageError
from relstream.wire.letters import DeadLetterMessage
from relstream.wire.messages import (
    Latency,
    MetricsMessage,
    PartialResultMessage,
    RelQueryMessage,
    RelQueryRow,
    ResultMessage,
    ResultRow,
    RowUsage,
    Usage,
)
from relstream.wire.messages import OutputSpec as OutputSpecMessage

MAX_REASON_CHARS = 4096  # a reason quoting a huge value is cut: the letter must fit
MAX_DEAD_LETTER_KEY_BYTES = 1024
ROW_KEYS_BYTES = 256 * 1024  # a letter names its rows' keys up to this many UTF-8 bytes


def relquery_from_message(message: RelQueryMessage) -> RelQuery:
    """A decoded relquery message as a RelQuery; a bad template or output spec is a
    MessageError naming the field."""
    try:
        template = Template(message.template)
    except TemplateError as exc:
        raise MessageError("relquery", f"field template: {exc}") from None
    output = None
    if message.output is not None:
        spec = message.output
        try:
            output = OutputSpec.build(spec.choices, spec.json_schema, spec.regex)
        except OutputSpecError as exc:
            raise MessageError("relquery", str(exc)) from None
    return RelQuery(
        id=message.id,
        template=template,
        rows=[Row(row.key, row.values) for row in message.rows],
        max_output_tokens=message.max_output_tokens,
        system_prompt=message.system_prompt,
        arrival_time=message.submitted_at,
        output=output,
        sampling=Sampling(message.temperature, message.top_p, message.seed, tuple(message.stop)),
        fields=tuple(message.fields or ()),
        cache_salt=message.cache_salt,
        deadline_s=message.deadline_s,
        priority=message.priority,
    )


def relquery_message(relquery: RelQuery, submitted_at: float | None = None) -> RelQueryMessage:
    output = relquery.output
    return RelQueryMessage(
        id=relquery.id,
        template=relquery.template.text,
        rows=[RelQueryRow(key=row.key, values=dict(row.values)) for row in relquery.rows],
        system_prompt=relquery.system_prompt,
        max_output_tokens=relquery.max_output_tokens,
        submitted_at=time.time() if submitted_at is None else submitted_at,
        output=None if output is None else output_message(output),
        fields=list(relquery.fields) or None,
        cache_salt=relquery.cache_salt,
        deadline_s=relquery.deadline_s,
        priority=relquery.priority,
        **sampling_fields(relquery.sampling),
    )


def sampling_fields(sampling: Sampling) -> dict:
    """The relquery message's sampling fields."""
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "seed": sampling.seed,
        "stop": list(sampling.stop),
    }


def output_message(spec: OutputSpec) -> OutputSpecMessage:
    if spec.kind is OutputKind.CHOICES:
        return OutputSpecMessage(choices=list(spec.choices))
    if spec.kind is OutputKind.JSON_SCHEMA:
        return OutputSpecMessage(json_schema=dict(spec.json_schema or {}))
    return OutputSpecMessage(regex=spec.regex)


def latency_message(latency: LatencyBreakdown | None) -> Latency | None:
    if latency is None:
        return None
    return Latency(
        queued=latency.queued,
        waiting=latency.waiting,
        core=latency.core,
        tail=latency.tail,
        total=latency.total,
    )


def row_usage(row: RowResult) -> RowUsage:
    """What the engine computed for `row`: nothing where the answer cache or an identical
    row's request answered it."""
    if row.cached or row.shared:
        return RowUsage()
    return RowUsage(
        prompt_tokens=row.prompt_tokens,
        prefix_cached_tokens=row.prefix_cached_tokens,
        output_tokens=row.generated_tokens,
    )


def usage_message(result: RelQueryResult, rows: list[RowUsage] | None = None) -> Usage:
    """The relQuery's rows' usage summed (docs/usage.md); `rows`: theirs, if known."""
    prompt = cached = output = 0
    for used in rows if rows is not None else map(row_usage, result.rows):
        prompt += used.prompt_tokens
        cached += used.prefix_cached_tokens
        output += used.output_tokens
    return Usage(
        prompt_tokens=prompt,
        prefix_cached_tokens=cached,
        output_tokens=output,
        answer_cached_rows=sum(row.cached for row in result.rows),
        shared_rows=sum(row.shared and not row.cached for row in result.rows),
    )


def result_message(result: RelQueryResult) -> ResultMessage:
    usages = [row_usage(row) for row in result.rows]
    pairs = zip(result.rows, usages, strict=True)
    return ResultMessage(
        id=result.relquery_id,
        rows=[ResultRow(**_row_fields(row, used)) for row, used in pairs],
        latency=latency_message(result.latency),
        policy=result.policy,
        model=result.model,
        completed_at=time.time(),
        deadline_met=result.deadline_met,
        usage=usage_message(result, usages),
    )


def partial_result_message(relquery_id: str, row: RowResult) -> PartialResultMessage:
    return PartialResultMessage(
        relquery_id=relquery_id, row_index=row.row_index, **_row_fields(row, row_usage(row))
    )


def _row_fields(row: RowResult, usage: RowUsage | None) -> dict[str, Any]:
    """A row result's fields as a result row and a partial result both carry them."""
    return {
        "key": row.row_key,
        "status": row.status.value,
        "output": row.output,
        "error": row.error,
        "value": row.value,
        "cached": row.cached,
        "usage": usage,
    }


def dead_letter_message(
    original: bytes | None,
    topic: str,
    partition: int | None,
    offset: int | None,
    reason: str,
    key: bytes | None,
    max_original_bytes: int,
    row_keys: list[str] | None = None,
) -> DeadLetterMessage:
    """Why a message could not be used, with its bytes up to `max_original_bytes` (the
    rest stated by size and digest), so the letter itself can always be published; the
    keys of the rows it held (`row_keys`: a relQuery's), named up to `ROW_KEYS_BYTES`
    even where its bytes are cut."""
    data = original if isinstance(original, bytes) else b""
    keys = row_keys or []
    return DeadLetterMessage(
        original=data[:max_original_bytes],
        original_size=len(data),
        original_sha256=hashlib.sha256(data).hexdigest(),
        truncated=len(data) > max_original_bytes,
        key=key[:MAX_DEAD_LETTER_KEY_BYTES] if key is not None else None,
        topic=topic,
        partition=partition,
        offset=offset,
        reason=reason[:MAX_REASON_CHARS],
        at=time.time(),
        row_keys=_named(keys, ROW_KEYS_BYTES),
        row_count=len(keys),
    )


def _named(keys: list[str], budget: int) -> list[str]:
    """The first `keys` whose UTF-8 bytes (and a few bytes of framing each) fit in
    `budget`."""
    named = []
    for key in keys:
        budget -= len(key.encode()) + 5
        if budget < 0:
            break
        named.append(key)
    return named


def metrics_message(result: RelQueryResult, engine: str) -> MetricsMessage:
    rows = Counter(row.status.value for row in result.rows)
    usage = usage_message(result)
    return MetricsMessage(
        relquery_id=result.relquery_id,
        latency=latency_message(result.latency),
        rows=dict(rows),
        output_tokens=usage.output_tokens,
        usage=usage,
        policy=result.policy,
        model=result.model,
        engine=engine,
        at=time.time(),
        deadline_met=result.deadline_met,
    )
