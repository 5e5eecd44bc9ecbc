"""Service process: a relQuery's row as a vLLM request and back.

The sampling parameters, a finished row checked against the relQuery's output
constraint, and its step times."""

from __future__ import annotations

import time
from dataclasses import dataclass

from relstream.engine.answers import SharedOutcome
from relstream.engine.twins import Role
from relstream.model import (
    LatencyBreakdown,
    RelQuery,
    RowFailure,
    RowRequest,
    RowResult,
    RowStatus,
    prepare_row,
    too_long,
)
from relstream.outputspec import OutputKind


def seconds_left(relquery: RelQuery, taken_at: float) -> float | None:
    """Seconds until `relquery`'s deadline (None: it has none; negative: passed): its
    `deadline_s` less the time since submission, in Kafka (wall clock, from its
    `arrival_time` when it has one) and in this engine since `taken_at` (monotonic)."""
    if relquery.deadline_s is None:
        return None
    queued = max(time.time() - relquery.arrival_time, 0.0) if relquery.arrival_time > 0 else 0.0
    return relquery.deadline_s - queued - (time.monotonic() - taken_at)


def sampling_params(relquery: RelQuery, extra_args: dict):
    """vLLM's sampling for a relQuery's rows: its sampling settings (greedy by default)
    and its structured-output constraint."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    sampling, output = relquery.sampling, relquery.output
    structured = None
    if output is not None:
        structured = StructuredOutputsParams(
            choice=list(output.choices) if output.kind is OutputKind.CHOICES else None,
            json=dict(output.json_schema) if output.kind is OutputKind.JSON_SCHEMA else None,
            regex=output.regex if output.kind is OutputKind.REGEX else None,
        )
    return SamplingParams(
        max_tokens=relquery.max_output_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        seed=sampling.seed,
        stop=list(sampling.stop) or None,
        structured_outputs=structured,
        extra_args=extra_args,
    )


def answered_row(
    relquery: RelQuery,
    request: RowRequest,
    answer: SharedOutcome,
    cached: bool = False,
    shared: bool = False,
    prompt_tokens: int = 0,
    prefix_cached_tokens: int = 0,
) -> RowResult:
    """A finished row (`cached`: from the answer cache; `shared`: an identical row's
    request answered it; `prompt_tokens`, `prefix_cached_tokens`: what its own request's
    prompt took, where it ran one); where the relQuery constrains its output, an answer that does
    not hold (cut off by max tokens, say) is that row's error, text kept."""
    value, reason = None, None
    if relquery.output is not None:
        value, reason = relquery.output.parse(answer.text)
    return RowResult(
        request.row_index,
        request.row_key,
        RowStatus.ERROR if reason else RowStatus.OK,
        answer.text,
        f"row {request.row_key!r}: {reason}" if reason else None,
        answer.output_tokens,
        value,
        cached,
        shared,
        prompt_tokens,
        prefix_cached_tokens,
    )


@dataclass
class RowTimes:
    scheduled: float
    first_token: float
    last_token: float


def breakdown(arrival: float, times: list[RowTimes]) -> LatencyBreakdown | None:
    """Paper §2.1 from the engine core's own per-request step timestamps."""
    if not times:
        return None
    start = max(arrival, min(t.scheduled for t in times))
    prefill_end = max(start, max(t.first_token for t in times))
    finish = max(prefill_end, max(t.last_token for t in times))
    return LatencyBreakdown.from_timestamps(arrival, start, prefill_end, finish)


@dataclass(frozen=True)
class TokenizedRow:
    request: RowRequest
    token_ids: list[int]  # the chat prompt, as the engine receives it


def row_times(output) -> RowTimes | None:
    stats = getattr(output, "metrics", None)
    if stats is None or not getattr(stats, "scheduled_ts", 0):
        return None
    return RowTimes(stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts)


def prompt_order(entry: tuple[TokenizedRow | RowFailure, Role]) -> list[int]:
    """Sorts rows by their prompts, so rows sharing a prefix reach vLLM together."""
    row = entry[0]
    return row.token_ids if isinstance(row, TokenizedRow) else []


def tokenize_row(
    tokenizer, relquery: RelQuery, index: int, max_model_len: int
) -> TokenizedRow | RowFailure:
    """Token ids of the row's chat prompt (the model's chat template, the relQuery's
    system prompt first), or the reason it cannot run: its prompt and output budget must
    fit the model's `max_model_len`."""
    prepared = prepare_row(relquery, index)
    if isinstance(prepared, RowFailure):
        return prepared
    messages = [{"role": "user", "content": prepared.prompt}]
    if relquery.system_prompt is not None:
        messages.insert(0, {"role": "system", "content": relquery.system_prompt})
    chat = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.encode(chat, add_special_tokens=False)
    failure = too_long(index, prepared.row_key, len(ids), max_model_len, relquery.max_output_tokens)
    return failure or TokenizedRow(prepared, ids)
