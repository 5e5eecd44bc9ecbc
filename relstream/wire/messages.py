"""Every message relstream reads or writes, one typed definition per kind.

Each definition gives the msgpack encoding, the validation on decode (whose error names
the field) and the JSON Schema published for producers in other languages
(`relstream/wire/json/`, generated from these types). The `version` field is the
struct tag: written on every message, required and checked on every decode.

Wire evolution, so a reader of the previous release survives a writer of this one and the
other way round (a rolling upgrade): decoders ignore fields they do not know within a
version, writers leave out every field at its default (`omit_defaults`), so a field added
with a default is never seen by a reader that predates it unless it carries news, and a
field that changes meaning takes a new version. `tests/wire/test_compatibility.py` holds the
previous release's schemas and checks both directions.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta

from relstream.outputspec import Sampling
from relstream.wire.usage import WIRE_STRUCT, RowUsage, Usage

WIRE_VERSION = 1

# Bounds every producer must respect; each is checked on decode.
MAX_ID_CHARS = 256
MAX_KEY_CHARS = 512
MAX_TABLE_CHARS = 256
MAX_TEMPLATE_CHARS = 65_536
MAX_RELQUERY_ROWS = 100_000
MAX_ROW_COLUMNS = 1024
MAX_OUTPUT_TOKENS = 32_768
MAX_CHOICES = 1024
MAX_REGEX_CHARS = 4096
MAX_STOP_STRINGS = 16
MAX_SIZE_CLASSES = 16  # a load report's size classes (placement/load.py, SIZE_CLASSES)
MAX_ROW_BYTES = 256 * 1024  # an encoded row message; the worker refuses larger ones
MAX_DEADLINE_S = 366 * 24 * 3600.0  # a deadline further off than a year is no deadline
MAX_PRIORITY = 100  # classes from -100 to 100

# NaN and the infinities are refused wherever a message is decoded (msgspec refuses them
# as out of these bounds; the error names the field): no reader downstream could use one,
# and a JSON reader could not even decode it.
Finite = Annotated[float, Meta(ge=-sys.float_info.max, le=sys.float_info.max)]
NonNegative = Annotated[float, Meta(ge=0, le=sys.float_info.max)]
Scalar = str | int | Finite | bool | None
# "null": a column the template names was null, so the row was never asked (NULL in,
# NULL out). Readers before it refuse a result holding such a row (docs/wire-format.md,
# message evolution).
RowStatusName = Literal["ok", "error", "cancelled", "null"]
NonEmpty = Annotated[str, Meta(min_length=1)]
RowKey = Annotated[str, Meta(min_length=1, max_length=MAX_KEY_CHARS)]
# A relQuery's settings, shared with the worker's registrations (`stream.registrations`),
# so that a registration is held to exactly the bounds its relQueries are decoded by.
TemplateText = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_TEMPLATE_CHARS,
        description="{column} placeholders; {{ and }} are literal braces",
    ),
]
SystemPrompt = Annotated[str, Meta(max_length=MAX_TEMPLATE_CHARS)]
OutputTokens = Annotated[int, Meta(ge=1, le=MAX_OUTPUT_TOKENS)]
Choices = Annotated[list[NonEmpty], Meta(min_length=1, max_length=MAX_CHOICES)]
Regex = Annotated[str, Meta(min_length=1, max_length=MAX_REGEX_CHARS)]
Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(gt=0, le=1)]
Seed = Annotated[int, Meta(ge=0, le=2**63 - 1)]
DeadlineSeconds = Annotated[
    float,
    Meta(
        gt=0,
        le=MAX_DEADLINE_S,
        description="seconds after `submitted_at` by which the answer is wanted: the "
        "scheduler lets a relQuery that can no longer make it wait behind those that can, "
        "and the result says whether it was met",
    ),
]
StopStrings = Annotated[list[NonEmpty], Meta(max_length=MAX_STOP_STRINGS)]
Priority = Annotated[
    int,
    Meta(
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="the relQuery's class: a higher one is served first and takes the "
        "seats of lower ones running (0 by default; a backfill below it)",
    ),
]
DeadlineMet = Annotated[
    bool | None,
    Meta(
        description="whether the relQuery was answered within its `deadline_s` (null: it "
        "set none, or no row ran)"
    ),
]
FreeFields = Annotated[
    list[NonEmpty],
    Meta(
        min_length=1,
        max_length=MAX_ROW_COLUMNS,
        description="the rows' fields whose order is free: `template` is then an instruction "
        "followed by one `name: value` line per field, shared values first",
    ),
]

ResultFormat = Annotated[
    Literal["msgpack", "json"],
    Meta(
        description="the encoding of this relQuery's result and partial results "
        "(docs/wire-format.md); unset: the engine's `--result-format`, msgpack by default"
    ),
]



class Message(msgspec.Struct, tag_field="version", **WIRE_STRUCT):
    """Common base: `kind` names the message in errors and in its JSON Schema."""

    kind: ClassVar[str]


class RowMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """One table row, produced to a rows topic (key: the row key). Values are scalars."""

    kind: ClassVar[str] = "row"
    table: Annotated[str, Meta(min_length=1, max_length=MAX_TABLE_CHARS)]
    key: RowKey
    values: Annotated[dict[str, Scalar], Meta(max_length=MAX_ROW_COLUMNS)]
    produced_at: Annotated[Finite, Meta(description="seconds since the epoch")] | (
        msgspec.UnsetType
    ) = msgspec.UNSET


# Its values are scalars, so it is never part of a reference cycle: gc=False keeps the
# rows of a 100,000-row relQuery out of every full garbage collection.
class RelQueryRow(msgspec.Struct, gc=False, **WIRE_STRUCT):
    """One row of an ad-hoc or windowed relQuery."""

    key: RowKey
    values: dict[str, Scalar]


class OutputSpec(msgspec.Struct, **WIRE_STRUCT):
    """What every row's answer must be, enforced while it is generated: exactly one of
    a label from `choices`, a JSON value valid against `json_schema`, or a match of
    `regex`."""

    choices: Choices | None = None
    json_schema: dict[str, Any] | None = None
    regex: Regex | None = None


_GREEDY = Sampling()  # the domain's sampling defaults: greedy, no seed, no stop


class QuerySettings(msgspec.Struct, **WIRE_STRUCT):
    """The settings a relQuery carries for all its rows, with their bounds and defaults:
    their one declaration. The relquery message is one (`RelQueryMessage`), and so is a
    [[query]] registration as written (`stream.registrations`), which the worker's windows
    pass on."""

    system_prompt: SystemPrompt | None = None
    temperature: Temperature = _GREEDY.temperature  # sampling's defaults: `Sampling`'s
    top_p: TopP = _GREEDY.top_p
    seed: Seed | None = _GREEDY.seed
    stop: StopStrings = msgspec.field(default_factory=list)
    fields: FreeFields | None = None  # free fields: the template is then the instruction
    deadline_s: DeadlineSeconds | None = None
    result_format: ResultFormat | None = None
    priority: Priority = 0


# Its settings for all rows (system prompt, sampling, fields, deadline, result format,
# priority) are `QuerySettings`'s, declared there once.
class RelQueryMessage(QuerySettings, Message, tag=WIRE_VERSION, kw_only=True):
    """A prompt template over rows: one LLM request per row (key: the relQuery id).
    Sampling is greedy unless `temperature` says otherwise."""

    kind: ClassVar[str] = "relquery"
    id: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]
    template: TemplateText
    rows: Annotated[list[RelQueryRow], Meta(min_length=1, max_length=MAX_RELQUERY_ROWS)]
    max_output_tokens: OutputTokens
    submitted_at: Annotated[
        Finite, Meta(description="seconds since the epoch; latency is measured from it")
    ]
    output: OutputSpec | None = None
    cache_salt: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=MAX_ID_CHARS,
                description="a tenant's salt: relQueries of other salts never share an "
                "answer (the answer cache) nor a cached prompt prefix (vLLM's cache_salt)",
            ),
        ]
        | None
    ) = None


class RelQueryHeader(RelQueryMessage, tag=WIRE_VERSION, kw_only=True):
    """A relquery message with its rows left as undecoded bytes, so their count can be
    checked first and they can be decoded a slice at a time
    (`relstream.wire.codec.decode_relquery_stepwise`)."""

    rows: msgspec.Raw


class Latency(msgspec.Struct, **WIRE_STRUCT):
    """In seconds: queued (submitted → the engine took it from Kafka), then paper §2.1:
    waiting (→ first prefill), core (→ last prefill ends), tail (→ last decode ends);
    total is their sum."""

    queued: NonNegative = 0.0
    waiting: NonNegative
    core: NonNegative
    tail: NonNegative
    total: NonNegative


class ResultRow(msgspec.Struct, **WIRE_STRUCT):
    key: str
    status: RowStatusName
    output: str | None = None  # the answer, when status is "ok"
    error: str | None = None  # why not, naming the row, otherwise
    value: Any = None  # the answer parsed, for a relQuery whose output has a JSON schema
    cached: bool = False  # answered from the engine's answer cache
    usage: RowUsage | None = None  # None: no row-level count (an older engine)


class ResultMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """Answer to one relQuery (key: the relQuery id). Rows in the relQuery's row order.
    A result too big for one Kafka message comes in `parts` messages, `part` 0 first, each
    with the next rows and the same other fields; readers join them
    (`relstream.wire.parts`)."""

    kind: ClassVar[str] = "result"
    id: NonEmpty
    rows: list[ResultRow]
    latency: Latency | None  # None when no row ran
    policy: str
    model: str
    completed_at: Annotated[Finite, Meta(description="seconds since the epoch")]
    part: Annotated[int, Meta(ge=0, description="this message's place among the parts")] = 0
    parts: Annotated[int, Meta(ge=1, description="messages the result came in")] = 1
    deadline_met: DeadlineMet = None
    usage: Usage | None = None  # the whole relQuery's, on every part


class PartialResultMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """One finished row of a relQuery, published as soon as it finishes (key: the relQuery
    id)."""

    kind: ClassVar[str] = "partial_result"
    relquery_id: NonEmpty
    row_index: Annotated[int, Meta(ge=0)]
    key: str
    status: RowStatusName
    output: str | None = None
    error: str | None = None
    value: Any = None  # the answer parsed, for a relQuery whose output has a JSON schema
    cached: bool = False  # answered from the engine's answer cache
    usage: RowUsage | None = None


class MetricsMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """What serving one relQuery took, published to the metrics topic with its result
    (key: the relQuery id): for dashboards that read Kafka rather than Prometheus."""

    kind: ClassVar[str] = "metrics"
    relquery_id: NonEmpty
    latency: Latency | None  # None when no row ran
    rows: dict[RowStatusName, Annotated[int, Meta(ge=0)]]  # rows by status
    output_tokens: Annotated[int, Meta(ge=0)]
    policy: str
    model: str
    engine: str  # the engine instance that served it (host and process id)
    at: Annotated[Finite, Meta(description="seconds since the epoch")]
    deadline_met: DeadlineMet = None
    usage: Usage | None = None  # `output_tokens` above is its output_tokens


KIND_HEADER = "relstream-kind"  # names a load report among the metrics topic's records


class LoadReportMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """One engine's load, every quarter second by default on the metrics topic (key: the
    engine; header `relstream-kind: load_report`), for placing relQueries by load
    (`relstream.placement`): the relqueries partitions it owns now and the work it has yet
    to do. A reader trusts a report only for a few seconds after `at`."""

    kind: ClassVar[str] = "load_report"
    engine: NonEmpty  # the engine instance (host and process id)
    topic: NonEmpty  # the relqueries topic whose partitions it owns
    partitions: list[Annotated[int, Meta(ge=0)]]  # from its consumer group assignment
    outstanding_s: Annotated[NonNegative, Meta(description="engine seconds of work left")]
    per_prompt_token_s: NonNegative = 0.0  # its cost fit, a prompt token
    per_output_token_s: NonNegative = 0.0  # and an output token
    templates: list[str] = []  # ids of templates it served lately, most recent first
    # its unfinished relQueries counted per size class (work left: class k from 2**(k-8) s
    # to twice that), at most 16 classes; absent from older engines' reports
    size_counts: Annotated[list[Annotated[int, Meta(ge=0)]], Meta(max_length=MAX_SIZE_CLASSES)] = []
    at: Annotated[Finite, Meta(description="seconds since the epoch")]
    # its work by priority class, (class, engine seconds), highest first, where any of its
    # work is not of class 0 (docs/priority.md); absent: all of class 0
    class_work: Annotated[
        list[tuple[Annotated[int, Meta(ge=-MAX_PRIORITY, le=MAX_PRIORITY)], NonNegative]],
        Meta(max_length=2 * MAX_PRIORITY + 1),
    ] = []
    # HMAC-SHA256 with the engines' secret, where one is set (placement/reports.py, report_mac)
    mac: Annotated[bytes, Meta(min_length=32, max_length=32)] | None = None
    # host:port it listens on while it runs (its Prometheus endpoint where it serves one):
    # `relstream status` asks whether it still does (an idle engine reports every 300 s)
    listens: Annotated[str, Meta(max_length=300)] | None = None

    @property
    def finite(self) -> bool:
        """Its work and prices are numbers: a fit gone to inf or NaN (or a writer's bug)
        is no load to place by, neither to publish nor to take."""
        numbers = (self.outstanding_s, self.per_prompt_token_s, self.per_output_token_s)
        return all(map(math.isfinite, [*numbers, *(work for _, work in self.class_work)]))


class ControlMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """A request to the engines, on the control topic: `cancel` names a relQuery whose
    unfinished rows are to be stopped (its result then has them "cancelled")."""

    kind: ClassVar[str] = "control"
    cancel: Annotated[str, Meta(min_length=1, max_length=MAX_ID_CHARS)]


# Version 2 names the model exactly and is signed; version 1 answers (unsigned, the model
# named by its last path component) are refused, and an engine counts and ignores them.
ANSWER_VERSION = 2


class AnswerMessage(Message, tag=ANSWER_VERSION, kw_only=True):
    """One answer of a deterministic request, on the compacted answers topic (key: the
    request's SHA-256 digest over the model's identity, prompt tokens, sampling, output
    constraint, token limit and tenant salt), so restarted engines and the engines of one
    group answer it again without running the model. `mac` is an HMAC-SHA256, with the
    secret the engines share, over the key and the other fields: an engine ignores (and
    counts) an answer without a valid one. A null value (a tombstone) removes the key."""

    kind: ClassVar[str] = "answer"
    model: NonEmpty  # the full model id, for people; `identity` is what is matched
    identity: Annotated[
        str,
        Meta(
            pattern="^[0-9a-f]{64}$",
            description="SHA-256 of the model's id, revision, dtype, quantization, tokenizer, "
            "chat template and vLLM version",
        ),
    ]
    text: str
    output_tokens: Annotated[int, Meta(ge=0, le=MAX_OUTPUT_TOKENS)]
    mac: Annotated[bytes, Meta(min_length=32, max_length=32)]
