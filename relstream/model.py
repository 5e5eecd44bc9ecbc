"""Domain model: templates, rows, relQueries, the requests they expand to, and latency.

A relQuery (paper §2.1) is one prompt template applied to every row of a table; its
latency is measured from its arrival to the end of its last request and splits into
waiting, core running and tail running time.
"""

from __future__ import annotations

import math
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from relstream.fieldlayout import shared_first
from relstream.outputspec import OutputSpec, Sampling


class TemplateError(ValueError):
    """A template that cannot be used at all (bad placeholder, unknown column)."""


class RowError(ValueError):
    """One row that cannot be rendered; the rest of the relQuery goes on."""


def _check_placeholder(field_name: str | None, conversion: str | None, spec: str | None) -> str:
    if field_name is None:
        raise TemplateError("internal: literal segment has no placeholder")
    shown = "{" + field_name + "}"
    if field_name == "" or field_name.isdigit():
        raise TemplateError(f"placeholder {shown} is positional; name a column, e.g. {{review}}")
    if "." in field_name or "[" in field_name:
        raise TemplateError(
            f"placeholder {shown} uses attribute or index access; only plain {{column}} "
            "names are allowed"
        )
    if conversion or spec:
        raise TemplateError(
            f"placeholder {{{field_name}...}} has a conversion or format spec; only plain "
            "{column} names are allowed"
        )
    return field_name


@dataclass(frozen=True)
class Template:
    """A prompt with `{column}` placeholders; `{{` and `}}` are literal braces.

    Rendering never calls `str.format`, so no placeholder can reach an attribute or item
    of a value: the text is split once into literals and column names.
    """

    text: str
    segments: tuple[tuple[str, str | None], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        segments: list[tuple[str, str | None]] = []
        try:
            parsed = list(string.Formatter().parse(self.text))
        except ValueError as exc:
            raise TemplateError(f"template is malformed: {exc}") from exc
        for literal, field_name, spec, conversion in parsed:
            column = None
            if field_name is not None:
                column = _check_placeholder(field_name, conversion, spec)
            segments.append((literal, column))
        object.__setattr__(self, "segments", tuple(segments))

    @property
    def columns(self) -> tuple[str, ...]:
        """Distinct column names in order of first use."""
        return tuple(dict.fromkeys(col for _, col in self.segments if col is not None))

    def check_columns(self, available: Sequence[str]) -> None:
        """Raise TemplateError naming every placeholder that is not a column."""
        missing = [col for col in self.columns if col not in set(available)]
        if missing:
            names = ", ".join("{" + col + "}" for col in missing)
            raise TemplateError(
                f"template names unknown column(s) {names}; available: {', '.join(available)}"
            )

    def render(self, values: Mapping[str, object]) -> str:
        parts: list[str] = []
        for literal, column in self.segments:
            parts.append(literal)
            if column is None:
                continue
            if column not in values or values[column] is None:
                raise RowError(f"row has no value for column {{{column}}}")
            parts.append(str(values[column]))
        return "".join(parts)


@dataclass(frozen=True)
class Row:
    key: str
    values: Mapping[str, object]


def request_id(relquery_id: str, row_index: int) -> str:
    """The engine request id of one row: unique per relQuery, and the relQuery is readable
    from it in any engine log."""
    return f"{relquery_id}#{row_index}"


@dataclass(frozen=True)
class RowRequest:
    """One LLM request instantiated from one row of a relQuery."""

    relquery_id: str
    row_index: int
    row_key: str
    prompt: str  # the rendered template, before any chat template

    @property
    def request_id(self) -> str:
        return request_id(self.relquery_id, self.row_index)


class RowStatus(StrEnum):
    OK = "ok"
    ERROR = "error"  # the row itself cannot run (bad row, prompt too long)
    CANCELLED = "cancelled"
    NULL = "null"  # a column the template names is null: not asked, no answer (NULL out)


@dataclass(frozen=True)
class RowFailure:
    row_index: int
    row_key: str
    reason: str  # names the row, ready for the user
    status: RowStatus = RowStatus.ERROR  # or NULL: a null input, never asked


def too_long(
    row_index: int, row_key: str, prompt_tokens: int, allowed: int, max_output_tokens: int
) -> RowFailure | None:
    """The row's failure if its prompt and output exceed the `allowed` context: the same
    words on every backend."""
    if prompt_tokens <= allowed - max_output_tokens:
        return None
    reason = f"row {row_key!r}: prompt has {prompt_tokens} tokens; the model allows "
    return RowFailure(
        row_index, row_key, f"{reason}{allowed} including {max_output_tokens} output tokens"
    )


@dataclass
class RelQuery:
    id: str
    template: Template
    rows: list[Row]
    max_output_tokens: int
    system_prompt: str | None = None
    arrival_time: float = 0.0
    output: OutputSpec | None = None  # what each answer must be; None: free text
    sampling: Sampling = field(default_factory=Sampling)
    # Free fields: the template is then an instruction, followed by these fields of each
    # row, one "name: value" line each, in its `field_orders` entry (shared values first).
    fields: tuple[str, ...] = ()
    # A tenant's salt (vLLM's cache_salt): it enters the answer cache's key and vLLM's
    # prefix cache, so relQueries of other salts never share an answer or a cached prefix.
    cache_salt: str | None = None
    # Seconds after its arrival by which its user wants the answer (None: no deadline).
    deadline_s: float | None = None
    priority: int = 0  # its class: higher goes first, preempting lower (docs/priority.md)
    field_orders: list[tuple[str, ...]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.max_output_tokens < 1:
            raise ValueError(f"relQuery {self.id}: max_output_tokens must be >= 1")
        if self.deadline_s is not None and not (0 < self.deadline_s < math.inf):
            raise ValueError(
                f"relQuery {self.id}: deadline_s must be a positive number of seconds, "
                f"not {self.deadline_s!r}"
            )
        self.field_orders = shared_first(self.rows, self.fields) if self.fields else []

    def instantiate(self) -> tuple[list[RowRequest], list[RowFailure]]:
        """Render every row; a row that fails is reported, not fatal."""
        requests: list[RowRequest] = []
        failures: list[RowFailure] = []
        for index in range(len(self.rows)):
            prepared = prepare_row(self, index)
            (requests if isinstance(prepared, RowRequest) else failures).append(prepared)
        return requests, failures


def prepare_row(relquery: RelQuery, index: int) -> RowRequest | RowFailure:
    """Row `index` rendered through the template, or why it cannot run: a row whose
    template column (or free field) is null gets status NULL and never reaches the model
    (NULL in, NULL out, as SQL's AI functions do); a row whose values are all blank, or
    one lacking a column the template names, is an error. Every backend starts here, so a
    row fails for the same reasons on the simulator and on vLLM."""
    row = relquery.rows[index]
    nulls = [
        name
        for name in dict.fromkeys((*relquery.template.columns, *relquery.fields))
        if name in row.values and row.values[name] is None
    ]
    if nulls:
        names = ", ".join("{" + name + "}" for name in nulls)
        reason = f"row {row.key!r}: {names} is null; a null input gives a null answer"
        return RowFailure(index, row.key, reason, RowStatus.NULL)
    if not any(str(v).strip() for v in row.values.values() if v is not None):
        return RowFailure(index, row.key, f"row {row.key!r} is empty")
    try:
        prompt = relquery.template.render(row.values)
    except RowError as exc:
        return RowFailure(index, row.key, f"row {row.key!r}: {exc}")
    missing = [name for name in relquery.fields if name not in row.values]
    if missing:
        return RowFailure(index, row.key, f"row {row.key!r} lacks field(s) {', '.join(missing)}")
    if relquery.fields:
        order = relquery.field_orders[index]
        prompt += "".join(f"\n{name}: {row.values[name]}" for name in order)
    return RowRequest(relquery.id, index, row.key, prompt)


@dataclass(frozen=True)
class RowResult:
    row_index: int
    row_key: str
    status: RowStatus
    output: str | None = None  # the generated text, when status is OK
    error: str | None = None  # why not, naming the row, otherwise
    output_tokens: int = 0
    value: Any = None  # the answer parsed, where the relQuery's output has a JSON schema
    cached: bool = False  # answered from the engine's answer cache, not computed for it
    shared: bool = False  # answered by an identical row's request in flight (not on the wire)
    prompt_tokens: int = 0  # its own request's prompt (0: it ran none)
    prefix_cached_tokens: int = 0  # of those, vLLM's prefix cache held (0: not known)

    @property
    def generated_tokens(self) -> int:
        """Tokens generated for it: none where the answer cache or a twin answered it."""
        return 0 if self.cached or self.shared else self.output_tokens

    @classmethod
    def failed(cls, failure: RowFailure) -> RowResult:
        """A row that never ran: an error, or null input, with its reason."""
        return cls(failure.row_index, failure.row_key, failure.status, error=failure.reason)

    @classmethod
    def cancelled(cls, request: RowRequest) -> RowResult:
        """A row whose relQuery was cancelled before it finished."""
        error = f"row {request.row_key!r}: relQuery cancelled"
        return cls(request.row_index, request.row_key, RowStatus.CANCELLED, error=error)


@dataclass(frozen=True)
class LatencyBreakdown:
    """Paper §2.1: waiting = start(p_1) − arrival, core = end(p_m) − start(p_1),
    tail = end(d_n) − end(p_m); arrival is when the engine took the relQuery. `queued`
    comes before: from its submission (a window's close) until the engine took it from
    Kafka, the backlog the engine had not yet taken in."""

    waiting: float
    core: float
    tail: float
    queued: float = 0.0

    @property
    def total(self) -> float:
        return self.queued + self.waiting + self.core + self.tail

    @classmethod
    def from_timestamps(
        cls, arrival: float, first_prefill_start: float, last_prefill_end: float, finish: float
    ) -> LatencyBreakdown:
        if not arrival <= first_prefill_start <= last_prefill_end <= finish:
            raise ValueError(
                "latency timestamps out of order: "
                f"{arrival=} {first_prefill_start=} {last_prefill_end=} {finish=}"
            )
        return cls(
            waiting=first_prefill_start - arrival,
            core=last_prefill_end - first_prefill_start,
            tail=finish - last_prefill_end,
        )

    def as_dict(self) -> dict[str, float]:
        return {
            "queued": self.queued,
            "waiting": self.waiting,
            "core": self.core,
            "tail": self.tail,
            "total": self.total,
        }


@dataclass
class RelQueryResult:
    relquery_id: str
    rows: list[RowResult]  # in row order
    latency: LatencyBreakdown | None  # None when no row ran
    policy: str  # the scheduling policy that served it
    model: str  # the model (or "sim") that answered
    # answered within the relQuery's deadline_s (None: it set none, or no row ran)
    deadline_met: bool | None = None

    @property
    def outputs(self) -> list[str | None]:
        return [row.output for row in self.rows]


def with_deadline(result: RelQueryResult, deadline_s: float | None) -> RelQueryResult:
    """`result`, saying whether its whole latency (from submission, queued time
    included) was within `deadline_s`."""
    if deadline_s is None or result.latency is None:
        return result
    return replace(result, deadline_met=result.latency.total <= deadline_s)


def cancelled_result(relquery: RelQuery, policy: str, model: str) -> RelQueryResult:
    """The result of a relQuery cancelled before any row finished: rows that could run
    are "cancelled", rows that could not are errors as always."""
    rows = []
    for index in range(len(relquery.rows)):
        prepared = prepare_row(relquery, index)
        if isinstance(prepared, RowFailure):
            rows.append(RowResult.failed(prepared))
        else:
            rows.append(RowResult.cancelled(prepared))
    return RelQueryResult(relquery.id, rows, None, policy, model)


def with_queued(result: RelQueryResult, queued: float, relquery: RelQuery) -> RelQueryResult:
    """`result` with the time its relQuery spent in Kafka before the engine took it, and
    whether it met its deadline."""
    latency = result.latency and replace(result.latency, queued=queued)
    return with_deadline(replace(result, latency=latency), relquery.deadline_s)
