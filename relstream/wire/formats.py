"""The two encodings of every message on the wire: msgpack (the default) and JSON.

Which one a record holds is said by its `content-type` header (`application/json`, or
`application/msgpack`, `application/x-msgpack`, `application/vnd.msgpack`; parameters such
as `; charset=utf-8` are ignored). A record without the header is read as JSON when its
first byte other than JSON whitespace is `{`, and as msgpack otherwise: every message is a
map, and a msgpack map starts with 0x80-0x8f, 0xde or 0xdf, whereas `{` (0x7b) and the
whitespace bytes (0x09, 0x0a, 0x0d, 0x20) are msgpack positive fixints, so no valid
msgpack message can be taken for JSON. Both decode against the same typed definitions
(`messages`), so their validation and their errors are the same (`codec`).

relstream writes msgpack with no header, as every release before, unless a relQuery, its
registration or the engine asks for JSON results: those carry `content-type:
application/json` (docs/wire-format.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal, TypeVar

from relstream.wire.codec import MessageError, decode, decode_json, encode, encode_json
from relstream.wire.messages import KIND_HEADER, LoadReportMessage, Message

Format = Literal["msgpack", "json"]
FORMATS: tuple[Format, ...] = ("msgpack", "json")
CONTENT_TYPE = "content-type"
JSON_TYPE = "application/json"
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack")
_JSON_START = re.compile(rb"[ \t\r\n]*\{")

M = TypeVar("M", bound=Message)
Headers = Iterable[tuple[str, bytes | None]] | None


def declared_type(headers: Headers) -> str | None:
    """The record's content type without parameters, lower case; None without the header."""
    for name, value in headers or ():
        if name.lower() == CONTENT_TYPE:
            text = (value or b"").decode("latin-1")
            return text.split(";", 1)[0].strip().lower()
    return None


def is_load_report(headers: Headers) -> bool:
    """Whether a metrics topic record is a load report (by its `relstream-kind` header)."""
    kind = LoadReportMessage.kind.encode()
    return any(name == KIND_HEADER and value == kind for name, value in headers or ())


def wire_format(kind: str, value: bytes | None, headers: Headers = None) -> Format:
    """The encoding of a record of `kind` (module doc); a MessageError for a content type
    relstream does not read."""
    declared = declared_type(headers)
    if declared is None:
        return "json" if value is not None and _JSON_START.match(value) else "msgpack"
    if declared == JSON_TYPE or declared.endswith("+json"):
        return "json"
    if declared in MSGPACK_TYPES:
        return "msgpack"
    raise MessageError(
        kind,
        f"header {CONTENT_TYPE}: {declared!r} is not one relstream reads "
        f"({JSON_TYPE} or {MSGPACK_TYPES[0]})",
    )


def decode_record(message_type: type[M], value: bytes | None, headers: Headers = None) -> M:
    """A record's message, in whichever encoding it holds, by the rules of `decode`."""
    if wire_format(message_type.kind, value, headers) == "json":
        if value is None:
            raise MessageError(message_type.kind, "empty message (no value)")
        return decode_json(message_type, value)
    return decode(message_type, value)


def encode_as(message: Message, fmt: Format) -> bytes:
    return encode_json(message) if fmt == "json" else encode(message)


def headers_for(fmt: Format) -> list[tuple[str, bytes]] | None:
    """The headers a message of `fmt` is written with: none for msgpack, as ever."""
    return [(CONTENT_TYPE, JSON_TYPE.encode())] if fmt == "json" else None
