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
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

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


def _registration(entry: dict, where: str) -> QueryRegistration:
    unknown = set(entry) - {f for f in QueryRegistration.__dataclass_fields__}
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
    registration = QueryRegistration(**{**entry, "template": template})
    if not registration.window_seconds > 0:
        raise RegistrationError(f"{where}: window_seconds must be > 0")
    if not 1 <= registration.max_rows <= 100_000:
        raise RegistrationError(f"{where}: max_rows must be in [1, 100000]")
    if not 1 <= registration.max_output_tokens <= 32_768:
        raise RegistrationError(f"{where}: max_output_tokens must be in [1, 32768]")
    return registration


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
