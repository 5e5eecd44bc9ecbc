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
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from relstream.answers import OutputSpec, OutputSpecError, Sampling
from relstream.model import Template, TemplateError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class RegistrationError(ValueError):
    pass


@dataclass(frozen=True)
class QueryRegistration:
    name: str
    table: str
    template: Template
    window_seconds: float = 2.0
    max_rows: int = 100
    max_output_tokens: int = 16
    system_prompt: str | None = None
    output: OutputSpec | None = None  # from choices, json_schema or regex
    sampling: Sampling = field(default_factory=Sampling)


OUTPUT_FIELDS = ("choices", "json_schema", "regex")
SAMPLING_FIELDS = ("temperature", "top_p", "seed", "stop")


def _registration(entry: dict, where: str) -> QueryRegistration:
    known = set(QueryRegistration.__dataclass_fields__) - {"output", "sampling"}
    unknown = set(entry) - known - set(OUTPUT_FIELDS) - set(SAMPLING_FIELDS)
    if unknown:
        raise RegistrationError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for required in ("name", "table", "template"):
        if not isinstance(entry.get(required), str) or not entry[required]:
            raise RegistrationError(f"{where}: field {required!r} must be a non-empty string")
    for key in ("name", "table"):
        if not _NAME.match(entry[key]):
            raise RegistrationError(
                f"{where}: field {key!r} = {entry[key]!r} must be a topic-safe name"
            )
    try:
        template = Template(entry["template"])
    except TemplateError as exc:
        raise RegistrationError(f"{where}: field 'template': {exc}") from None
    output = None
    if any(name in entry for name in OUTPUT_FIELDS):
        try:
            output = OutputSpec.build(*(entry.pop(name, None) for name in OUTPUT_FIELDS))
        except OutputSpecError as exc:
            raise RegistrationError(f"{where}: {exc}") from None
    sampling = _sampling({name: entry.pop(name) for name in SAMPLING_FIELDS if name in entry})
    if isinstance(sampling, str):
        raise RegistrationError(f"{where}: {sampling}")
    for name, value in entry.items():
        if name in _BOUNDED and not _BOUNDED[name].holds(value):
            raise RegistrationError(
                f"{where}: field {name!r} = {value!r} must be {_BOUNDED[name].expected}"
            )
    return QueryRegistration(
        **{**entry, "template": template, "output": output, "sampling": sampling}
    )


@dataclass(frozen=True)
class _Bound:
    """What an optional scalar field may hold: its types, its range, and both in words."""

    types: tuple[type, ...]
    in_range: Callable[[object], bool]
    expected: str

    def holds(self, value: object) -> bool:
        # TOML's true is a bool, which Python also counts as an int: never a number here.
        if isinstance(value, bool) or not isinstance(value, self.types):
            return False
        return self.in_range(value)


_BOUNDED = {
    "window_seconds": _Bound((int, float), lambda v: v > 0, "a number of seconds > 0"),
    "max_rows": _Bound((int,), lambda v: 1 <= v <= 100_000, "an integer in [1, 100000]"),
    "max_output_tokens": _Bound((int,), lambda v: 1 <= v <= 32_768, "an integer in [1, 32768]"),
    "system_prompt": _Bound((str,), lambda v: True, "a string"),
}


def _sampling(given: dict) -> Sampling | str:
    """The sampling settings, or why they cannot be used (naming the field)."""
    temperature, top_p = given.get("temperature", 0.0), given.get("top_p", 1.0)
    seed, stop = given.get("seed"), given.get("stop", [])
    if not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        return "field 'temperature' must be a number in [0, 2]"
    if not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        return "field 'top_p' must be a number in (0, 1]"
    if seed is not None and (not isinstance(seed, int) or seed < 0):
        return "field 'seed' must be a non-negative integer"
    if not isinstance(stop, list) or not all(isinstance(x, str) and x for x in stop):
        return "field 'stop' must be a list of non-empty strings"
    return Sampling(float(temperature), float(top_p), seed, tuple(stop))


def load_registrations(path: Path) -> list[QueryRegistration]:
    try:
        document = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as exc:
        raise RegistrationError(f"{path}: not valid TOML ({exc})") from None
    entries = document.get("query")
    if not isinstance(entries, list) or not entries:
        raise RegistrationError(f"{path}: no [[query]] tables")
    registrations = [_registration(e, f"{path} [[query]] #{i + 1}") for i, e in enumerate(entries)]
    names = [r.name for r in registrations]
    if len(set(names)) != len(names):
        raise RegistrationError(f"{path}: query names must be unique")
    return registrations
