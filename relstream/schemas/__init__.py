"""The wire contract: msgpack messages, each kind with a JSON Schema beside this file.

`encode` validates then packs; `decode` unpacks strictly (UTF-8 strings, no trailing
bytes, a size limit) then validates. Every failure is a MessageError whose reason names
the offending field, ready to go to the dead-letter topic.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import msgpack
from jsonschema import Draft202012Validator

KINDS = ("row", "relquery", "result", "partial_result", "metric", "dead_letter")
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # larger messages are refused before unpacking


class MessageError(ValueError):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason


@cache
def schema(kind: str) -> dict[str, Any]:
    if kind not in KINDS:
        raise ValueError(f"unknown message kind {kind!r}; known: {', '.join(KINDS)}")
    text = resources.files(__package__).joinpath(f"{kind}.schema.json").read_text()
    return json.loads(text)


@cache
def _validator(kind: str) -> Draft202012Validator:
    return Draft202012Validator(schema(kind))


def _field_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(message)"


_SCALARS = (str, int, float, bool, type(None))
_ROW_FIELDS = {"version", "table", "key", "values", "produced_at"}


def _row_is_valid(message: dict) -> bool:
    """row.schema.json by hand: rows are the hot path (tens of thousands a second), and
    jsonschema is only needed to word the error when this says no."""
    values = message.get("values")
    table, key = message.get("table"), message.get("key")
    produced_at = message.get("produced_at", 0.0)
    version = message.get("version")
    return (
        version == 1
        and not isinstance(version, bool)  # JSON Schema's const 1 takes 1.0 but not true
        and message.keys() <= _ROW_FIELDS
        and isinstance(table, str)
        and 1 <= len(table) <= 256
        and isinstance(key, str)
        and 1 <= len(key) <= 512
        and isinstance(values, dict)
        and len(values) <= 1024
        and all(isinstance(v, _SCALARS) for v in values.values())
        and isinstance(produced_at, int | float)
        and not isinstance(produced_at, bool)
    )


_FAST_CHECKS = {"row": _row_is_valid}


def validate(kind: str, message: Any) -> None:
    if not isinstance(message, dict):
        raise MessageError(kind, f"expected a map, got {type(message).__name__}")
    fast = _FAST_CHECKS.get(kind)
    if fast is not None and fast(message):
        return
    errors = sorted(_validator(kind).iter_errors(message), key=lambda e: list(e.absolute_path))
    if errors:
        first = errors[0]
        raise MessageError(kind, f"field {_field_path(first.absolute_path)}: {first.message}")
    if kind == "dead_letter" and not isinstance(message["original"], bytes):
        raise MessageError(kind, "field original: must be bytes")


def encode(kind: str, message: dict[str, Any]) -> bytes:
    validate(kind, message)
    return msgpack.packb(message, use_bin_type=True)


def decode(kind: str, data: bytes) -> dict[str, Any]:
    if data is None:
        raise MessageError(kind, "empty message (no value)")
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(kind, f"message is {len(data)} bytes; the limit is {MAX_MESSAGE_BYTES}")
    try:
        message = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except UnicodeDecodeError as exc:
        raise MessageError(kind, f"a string is not valid UTF-8 ({exc.reason})") from None
    except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError) as exc:
        raise MessageError(kind, f"not valid msgpack ({exc})") from None
    validate(kind, message)
    return message
