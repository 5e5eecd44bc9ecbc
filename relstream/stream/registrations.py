"""Query registrations: which rows topic feeds which template, and how rows are windowed.

A TOML file holds one [[query]] table per registration:

    [[query]]
    name = "review-sentiment"          # relQuery ids start with it
    table = "reviews"                  # rows come from <prefix>rows.reviews
    template = "Classify the sentiment of {review} as Positive or Negative."
    window_seconds = 2.0               # a relQuery at least this often...
    max_rows = 100                     # ...or as soon as this many rows arrived
    max_output_tokens = 5
    system_prompt = "You label reviews."   # optional
    choices = ["Positive", "Negative"]     # optional: the answer is one of these...
    # json_schema = {type = "object", ...} # ...or a JSON value valid here
    # regex = "[0-9]+"                     # ...or a match of this
    temperature = 0.0                      # optional sampling: temperature, top_p,
    seed = 7                               # seed, stop (greedy by default)
    deadline_s = 30.0                      # optional: wanted within this many seconds
                                           # of the window's close
    result_format = "json"                 # optional: its results in JSON, with the
                                           # header content-type: application/json
    priority = 0                           # optional: its class, higher first
    backfill_after_s = 60.0                # optional: a window whose first row is older
                                           # goes one class below (docs/priority.md)

Instead of a `template`, a query may give an `instruction` and its `fields`, a list of
the row's columns whose order is free: each prompt is then the instruction followed by
one `name: value` line per field, the fields whose values the window's rows share most
first, so that their prompts share a longer prefix (vLLM's prefix cache computes it once).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import msgspec
from msgspec import NODEFAULT, Meta

from relstream.model import Template, TemplateError
from relstream.outputspec import OutputSpec, OutputSpecError, Sampling
from relstream.wire.codec import MessageError, convert
from relstream.wire.messages import (
    MAX_RELQUERY_ROWS,
    Choices,
    OutputTokens,
    QuerySettings,
    Regex,
    TemplateText,
)

TopicSafeName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")]


class RegistrationError(ValueError):
    pass


class _Written(QuerySettings, forbid_unknown_fields=True, kw_only=True):
    """One [[query]] table as written: the relQuery settings its windows carry, declared
    once with their bounds and defaults (`wire.messages.QuerySettings`), and the
    registration's own."""

    name: TopicSafeName
    table: TopicSafeName
    template: TemplateText | None = None
    instruction: TemplateText | None = None  # with `fields`, instead of a template
    window_seconds: Annotated[float, Meta(gt=0)] = 2.0
    max_rows: Annotated[int, Meta(ge=1, le=MAX_RELQUERY_ROWS)] = 100
    max_output_tokens: OutputTokens = 16  # required on the wire, defaulted here
    choices: Choices | None = None
    json_schema: dict[str, Any] | None = None
    regex: Regex | None = None
    backfill_after_s: Annotated[float, Meta(gt=0)] | None = None


# Each setting's default as `_Written` declares it (or `QuerySettings` for it): a
# registration made in code (the tests, the lab) gets the same as one read from TOML.
_DEFAULT = {
    f.name: f.default for f in msgspec.structs.fields(_Written) if f.default is not NODEFAULT
}


@dataclass(frozen=True)
class QueryRegistration:
    """A [[query]] registration as the worker uses it: `_Written` with its template parsed,
    its output spec built and its sampling gathered."""

    name: str
    table: str
    template: Template
    window_seconds: float = _DEFAULT["window_seconds"]
    max_rows: int = _DEFAULT["max_rows"]
    max_output_tokens: int = _DEFAULT["max_output_tokens"]
    system_prompt: str | None = _DEFAULT["system_prompt"]
    output: OutputSpec | None = None  # from choices, json_schema or regex
    sampling: Sampling = field(default_factory=Sampling)  # `QuerySettings` derives from it
    fields: tuple[str, ...] = ()  # free fields: `template` is then the instruction
    deadline_s: float | None = _DEFAULT["deadline_s"]  # each window's relQuery wanted by
    result_format: str | None = _DEFAULT["result_format"]  # "json"; None: the engine's
    priority: int = _DEFAULT["priority"]  # its windows' class: higher first (docs/priority.md)
    # a window whose first row is older than this when cut goes one class below: a
    # reset's or a replay's rows, a backlog (None: never)
    backfill_after_s: float | None = _DEFAULT["backfill_after_s"]


def worker_group(app_id: str, query: str) -> str:
    """The consumer group with which a worker (`--app-id`) reads the rows of `query`:
    each registration has its own offsets, and `relstream reset` moves them."""
    return f"{app_id}-{query}"


def _registration(entry: dict, where: str) -> QueryRegistration:
    try:
        written = convert(_Written, entry, "registration")
        if (written.template is None) == (written.instruction is None) or (
            (written.instruction is None) != (written.fields is None)
        ):
            raise RegistrationError(
                f"{where}: give a template, or an instruction with its fields (not both)"
            )
        template = Template(written.template or written.instruction)
        output = None
        if any(x is not None for x in (written.choices, written.json_schema, written.regex)):
            output = OutputSpec.build(written.choices, written.json_schema, written.regex)
    except MessageError as exc:
        raise RegistrationError(f"{where}: {exc.reason}") from None
    except TemplateError as exc:
        name = "template" if written.template else "instruction"
        raise RegistrationError(f"{where}: field {name}: {exc}") from None
    except OutputSpecError as exc:
        raise RegistrationError(f"{where}: {exc}") from None
    return QueryRegistration(
        written.name,
        written.table,
        template,
        written.window_seconds,
        written.max_rows,
        written.max_output_tokens,
        written.system_prompt,
        output,
        Sampling(written.temperature, written.top_p, written.seed, tuple(written.stop)),
        tuple(written.fields or ()),
        written.deadline_s,
        written.result_format,
        written.priority,
        written.backfill_after_s,
    )


def _unknown_keys(table: dict, known: tuple[str, ...], where: str) -> list[str]:
    """Each key of `table` not among `known`, with the known name nearest it."""
    import difflib

    said = []
    for key in table:
        if key not in known:
            near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            said.append(f"{where}: unknown key {key!r}{hint}")
    return said


def load_registrations(path: Path) -> list[QueryRegistration]:
    try:
        document = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise RegistrationError(f"{path}: not valid TOML ({exc})") from None
    entries = document.get("query")
    unknown = _unknown_keys(document, ("query",), str(path))
    if isinstance(entries, list):
        for i, entry in enumerate(entries):
            if isinstance(entry, dict):
                where = f"{path} [[query]] #{i + 1}"
                unknown += _unknown_keys(entry, _Written.__struct_fields__, where)
    if unknown:  # every typo at once, not one a run
        raise RegistrationError("; ".join(unknown))
    if not isinstance(entries, list) or not entries:
        raise RegistrationError(f"{path}: no [[query]] tables")
    registrations = [_registration(e, f"{path} [[query]] #{i + 1}") for i, e in enumerate(entries)]
    names = [r.name for r in registrations]
    if len(set(names)) != len(names):
        raise RegistrationError(f"{path}: query names must be unique")
    return registrations
