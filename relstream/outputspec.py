"""What a relQuery's answers must look like, and how they are sampled.

`OutputSpec` is one of three constraints the engine enforces while it generates (vLLM's
structured outputs): a label from a list of choices, a JSON value valid against a JSON
Schema, or a match of a regular expression. A malformed spec is refused before anything
runs, naming the field; an answer that still does not parse is an error for that row.
`Sampling` is per relQuery; greedy is the default, so answers do not depend on the
scheduler.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class OutputSpecError(ValueError):
    """A structured-output spec that cannot work; the message names the field."""


class OutputKind(StrEnum):
    CHOICES = "choices"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.0  # 0: greedy, the same answer under every policy
    top_p: float = 1.0
    seed: int | None = None  # with a temperature, the same answers on every run
    stop: tuple[str, ...] = ()  # strings that end an answer (not included in it)


@dataclass(frozen=True)
class OutputSpec:
    kind: OutputKind
    choices: tuple[str, ...] = ()
    json_schema: Mapping[str, Any] | None = None
    regex: str | None = None

    @classmethod
    def build(
        cls,
        choices: list[str] | None = None,
        json_schema: Mapping[str, Any] | None = None,
        regex: str | None = None,
    ) -> OutputSpec:
        """The spec from its one given field; raises OutputSpecError naming the field."""
        given = [
            name
            for name, value in (
                ("choices", choices),
                ("json_schema", json_schema),
                ("regex", regex),
            )
            if value is not None
        ]
        if len(given) != 1:
            raise OutputSpecError(
                "field output: give exactly one of choices, json_schema or regex"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if choices is not None:
            return cls(OutputKind.CHOICES, choices=_checked_choices(choices))
        if json_schema is not None:
            return cls(OutputKind.JSON_SCHEMA, json_schema=_checked_schema(json_schema))
        return cls(OutputKind.REGEX, regex=_checked_regex(regex))

    def parse(self, text: str) -> tuple[Any, str | None]:
        """(the parsed value, None) for an answer that holds, or (None, why not)."""
        if self.kind is OutputKind.CHOICES:
            if text.strip() in self.choices:
                return None, None
            return None, f"answer {text[:80]!r} is not one of the choices"
        if self.kind is OutputKind.REGEX:
            if re.fullmatch(self.regex, text):
                return None, None
            return None, f"answer {text[:80]!r} does not match the regex"
        return _parse_json(text, self.json_schema)


def _checked_choices(choices: list[str]) -> tuple[str, ...]:
    if not choices:
        raise OutputSpecError("field output.choices: give at least one choice")
    if len(set(choices)) != len(choices):
        raise OutputSpecError("field output.choices: choices repeat")
    return tuple(choices)


def _checked_schema(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        raise OutputSpecError(
            f"field output.json_schema{'.' + where if where else ''}: not a valid JSON "
            f"Schema ({exc.message})"
        ) from None
    return schema


def _checked_regex(regex: str | None) -> str:
    try:
        re.compile(regex or "")
    except re.error as exc:
        raise OutputSpecError(
            f"field output.regex: not a valid regular expression ({exc})"
        ) from None
    return regex or ""


def _parse_json(text: str, schema: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    import jsonschema

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        return None, f"answer is not JSON ({exc.msg} at character {exc.pos})"
    try:
        jsonschema.validate(value, schema or {})
    except jsonschema.ValidationError as exc:
        return None, f"answer does not match the schema ({exc.message})"
    return value, None
