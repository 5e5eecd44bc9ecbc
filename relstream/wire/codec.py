"""msgpack in and out of the typed messages, with errors that name the field.

`decode` refuses oversize input before reading it, then decodes strictly (UTF-8 strings,
no trailing bytes, the types and bounds of `messages`). `validate` applies the same rules
to Python values (a row read from a file, a JSON body). Every failure is a MessageError
whose reason is ready for the dead-letter topic.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from functools import cache
from typing import Any, TypeVar

import msgspec

from relstream.wire.messages import (
    MAX_RELQUERY_ROWS,
    Message,
    RelQueryHeader,
    RelQueryMessage,
    RelQueryRow,
    RowMessage,
)

MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # larger messages are refused before unpacking
# Rows and bytes decoded between two yields to the event loop, whichever comes first:
# 1,024 rows of one short column, or 32 KiB of wide rows (about 10 rows of 512 fields),
# take ~1-4 ms on this project's CPUs.
ROWS_PER_SLICE = 1024
BYTES_PER_SLICE = 32 * 1024

M = TypeVar("M", bound=Message)
T = TypeVar("T", bound=msgspec.Struct)


class MessageError(ValueError):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"{kind}: {reason}")
        self.kind = kind
        self.reason = reason


_ENCODER = msgspec.msgpack.Encoder()
_JSON_ENCODER = msgspec.json.Encoder()
# The integers msgpack holds: a JSON row's larger one would fail when its window's
# relQuery is encoded, so JSON messages are held to them on decode.
_INT_RANGE = (-(2**63), 2**64 - 1)


def encode(message: Message) -> bytes:
    return _ENCODER.encode(message)


def encode_json(message: Message) -> bytes:
    """The message's JSON form (bytes as base64), as `docs/wire-format.md` shows it."""
    return _JSON_ENCODER.encode(message)


class _NoVersion(msgspec.Struct, tag_field="version", tag=-1):
    """Never a valid message. msgspec requires the tag field only of a union's members, so
    each message type is decoded as a union with this one: a message without `version`
    is refused, naming the field, as the wire contract says."""


def _versioned(message_type: type) -> Any:
    if isinstance(message_type, type) and issubclass(message_type, Message):
        return message_type | _NoVersion
    return message_type


@cache
def _decoder(message_type: type) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(_versioned(message_type))


@cache
def _json_decoder(message_type: type) -> msgspec.json.Decoder:
    return msgspec.json.Decoder(_versioned(message_type))


def _checked_version(kind: str, message: Any) -> Any:
    if isinstance(message, _NoVersion):
        raise MessageError(
            kind, f"field version: {_NoVersion.__struct_config__.tag} is not a version"
        )
    return message


def decode(message_type: type[M], data: bytes | None) -> M:
    """The message in `data`, or a MessageError naming what is wrong."""
    _check_size(message_type.kind, data)
    try:
        message = _decoder(message_type).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise MessageError(message_type.kind, _explain(data, exc)) from None
    return _checked_version(message_type.kind, message)


def decode_json(message_type: type[M], data: bytes) -> M:
    """The message from its JSON form (a record, an HTTP body), by the rules of `decode`."""
    _check_size(message_type.kind, data)
    try:
        message = _json_decoder(message_type).decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise MessageError(message_type.kind, _explain_json(exc)) from None
    message = _checked_version(message_type.kind, message)
    if isinstance(message, RowMessage):
        _check_ints(message.kind, message.values, "values")
    elif type(message) is RelQueryMessage:  # not a RelQueryHeader, its rows undecoded
        for index, row in enumerate(message.rows):
            _check_ints(message.kind, row.values, f"rows[{index}].values")
    return message


def checked(message: M) -> M:
    """A message built in code from outside values (a file's row, say), checked by the
    rules `decode` applies; raises MessageError naming the field."""
    return decode(type(message), encode(message))


def validate(message_type: type[M], value: Mapping[str, Any]) -> M:
    """Python values (str keys, scalars, bytes) checked by exactly the rules of `decode`,
    by decoding their msgpack form."""
    return decode(message_type, _ENCODER.encode(value))


def convert(struct_type: type[T], value: Mapping[str, Any], kind: str) -> T:
    """Python values (a parsed TOML table, say) as `struct_type`, by msgspec's strict rules;
    a MessageError names the field as `decode`'s do."""
    try:
        return msgspec.convert(value, struct_type)
    except msgspec.ValidationError as exc:
        raise MessageError(kind, _field_reason(str(exc))) from None


async def decode_relquery_stepwise(data: bytes | None, json: bool = False) -> RelQueryMessage:
    """`decode(RelQueryMessage, data)` (`decode_json` if `json`) that yields to the event
    loop between slices of rows, so the largest message the limits allow never stalls a
    serving loop for more than a few milliseconds."""
    if json:
        if data is None:
            raise MessageError("relquery", "empty message (no value)")
        header = decode_json(RelQueryHeader, data)
        decoder, explain = _json_decoder, lambda raw, exc: _explain_json(exc)
    else:
        header = decode(RelQueryHeader, data)
        _check_row_count(header.rows)  # from the msgpack array's header, before any row
        decoder, explain = _decoder, _explain
    try:
        raw_rows = decoder(list[msgspec.Raw]).decode(header.rows)
    except msgspec.ValidationError as exc:
        raise MessageError("relquery", _nest(_field_reason(str(exc)), "rows")) from None
    if json:  # the count, as `_check_row_count` words it
        if not raw_rows:
            raise MessageError("relquery", "field rows: expected `array` of length >= 1")
        if len(raw_rows) > MAX_RELQUERY_ROWS:
            raise MessageError(
                "relquery", f"field rows: expected `array` of length <= {MAX_RELQUERY_ROWS}"
            )
    rows: list[RelQueryRow] = []
    row_decoder = decoder(RelQueryRow)
    sliced_rows = sliced_bytes = 0
    for index, raw in enumerate(raw_rows):
        if sliced_rows >= ROWS_PER_SLICE or sliced_bytes >= BYTES_PER_SLICE:
            await asyncio.sleep(0)
            sliced_rows = sliced_bytes = 0
        sliced_rows += 1
        sliced_bytes += len(raw)
        try:
            row = row_decoder.decode(raw)
        except (msgspec.ValidationError, msgspec.DecodeError, UnicodeDecodeError) as exc:
            reason = explain(bytes(raw), exc)
            raise MessageError("relquery", _nest(reason, f"rows[{index}]")) from None
        if json:
            _check_ints("relquery", row.values, f"rows[{index}].values")
        rows.append(row)
    fields = {f: getattr(header, f) for f in header.__struct_fields__ if f != "rows"}
    return RelQueryMessage(**fields, rows=rows)


def _check_row_count(rows: msgspec.Raw) -> None:
    """Refuse too many rows (or none) from the msgpack array header alone, before a
    single row is decoded; anything but an array is left to the typed decode to word."""
    raw = memoryview(rows)
    kind = raw[0]
    if 0x90 <= kind <= 0x9F:  # fixarray: the count is in the low four bits
        count = kind & 0x0F
    elif kind in (0xDC, 0xDD):  # array 16 / array 32: a big-endian count follows
        count = int.from_bytes(raw[1 : 3 if kind == 0xDC else 5], "big")
    else:
        return
    if count < 1:
        raise MessageError("relquery", "field rows: expected `array` of length >= 1")
    if count > MAX_RELQUERY_ROWS:
        raise MessageError(
            "relquery", f"field rows: expected `array` of length <= {MAX_RELQUERY_ROWS}"
        )


def _check_size(kind: str, data: bytes | None) -> None:
    if data is None:
        raise MessageError(kind, "empty message (no value)")
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(kind, f"message is {len(data)} bytes; the limit is {MAX_MESSAGE_BYTES}")


def _explain(data: bytes, exc: Exception) -> str:
    """Malformed bytes are named before shape problems: an untyped decode (on the error
    path only) tells a bad string or bad msgpack from a well-formed message of the wrong
    shape."""
    try:
        msgspec.msgpack.decode(data)
    except (UnicodeDecodeError, msgspec.DecodeError) as malformed:
        return _bad_text(malformed) or f"not valid msgpack ({malformed})"
    return _field_reason(str(exc))


def _explain_json(exc: Exception) -> str:
    if isinstance(exc, msgspec.ValidationError):
        return _field_reason(str(exc))
    return _bad_text(exc) or f"not valid JSON ({exc})"


def _bad_text(exc: Exception) -> str | None:
    """A string that is not UTF-8, as msgspec says it: a UnicodeDecodeError up to 0.22,
    a DecodeError naming UTF-8 from 0.23 on."""
    if isinstance(exc, UnicodeDecodeError):
        return f"a string is not valid UTF-8 ({exc.reason})"
    if isinstance(exc, msgspec.DecodeError) and "UTF-8" in str(exc):
        return "a string is not valid UTF-8"
    return None


def _check_ints(kind: str, values: Mapping[str, Any], path: str) -> None:
    low, high = _INT_RANGE
    for name, value in values.items():
        if type(value) is int and not low <= value <= high:
            raise MessageError(kind, f"field {path}.{name}: integer out of range (at most 64 bits)")


_AT = re.compile(r"^(?P<problem>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]+)`")
_UNKNOWN = re.compile(r"Object contains unknown field `(?P<name>[^`]+)`")
_NOT_A_MAP = re.compile(r"Expected `object`, got `(?P<got>[^`]+)`")
_NOT_FINITE = re.compile(r"Expected `float` [<>]= -?1\.7976931348623157e\+308")


def _field_reason(text: str) -> str:
    """msgspec's "<problem> - at `$.a[1].b`" as "field a[1].b: <problem>"."""
    match = _AT.match(text)
    assert match is not None  # the pattern matches any text
    problem, path = match["problem"], (match["path"] or "").lstrip(".")
    if missing := _MISSING.fullmatch(problem):
        name = missing["name"]
        return f"field {_join(path, name)}: '{name}' is a required field"
    if unknown := _UNKNOWN.fullmatch(problem):
        return f"field {_join(path, unknown['name'])}: not a field of this message"
    if not path and (not_a_map := _NOT_A_MAP.fullmatch(problem)):
        return f"expected a map, got {not_a_map['got']}"
    if _NOT_FINITE.fullmatch(problem):  # the bounds of `messages.Finite`
        problem = "Expected a finite number, not NaN or an infinity"
    problem = problem[0].lower() + problem[1:]
    return f"field {path}: {problem}" if path else problem


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _nest(reason: str, prefix: str) -> str:
    """A row's reason, re-rooted at its place in the relQuery."""
    if reason.startswith("field "):
        return f"field {prefix}.{reason.removeprefix('field ')}"
    return f"field {prefix}: {reason}"
