"""Dead letters, and the marks `relstream replay` leaves beside them.

A dead letter (`DeadLetterMessage`) keeps a message relstream could not use and why. A
replay sends letters' messages back where they came from, then writes one
`ReplayedMessage` to the dead-letter topic naming them (header `relstream-kind:
replayed`), so `relstream deadletters` says which letters went back and when. A mark only
informs: a topic anyone can write is no source of truth, and nothing decides on it.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec
from msgspec import Meta

from relstream.wire.messages import (
    MAX_ID_CHARS,
    WIRE_VERSION,
    Finite,
    Message,
    NonEmpty,
)
from relstream.wire.usage import WIRE_STRUCT

MAX_MARKED = 1000  # letters one mark names (a replay of more writes more marks)


class DeadLetterMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """A message relstream could not use, with why (key: the original key, cut to a
    bound). The original bytes are kept up to a bound below the producer's request limit,
    so a letter always fits; `original_size` and `original_sha256` describe them whole."""

    kind: ClassVar[str] = "dead_letter"
    original: Annotated[
        bytes, Meta(description="the bytes received, the first `original_size` or fewer")
    ]
    original_size: Annotated[int, Meta(ge=0, description="bytes the message had")] = 0
    original_sha256: Annotated[str, Meta(description="hex SHA-256 of all its bytes")] = ""
    truncated: Annotated[bool, Meta(description="`original` holds only its first bytes")] = False
    key: bytes | None = None
    topic: str
    partition: int | None = None
    offset: int | None = None
    reason: NonEmpty
    at: Finite
    row_keys: Annotated[
        list[str],
        Meta(description="keys of the rows the original held (a relQuery's), as many as fit "
                         "in 256 KiB; `row_count` says how many it held"),
    ] = msgspec.field(default_factory=list)  # fmt: skip
    row_count: Annotated[int, Meta(ge=0, description="rows the original held; 0: not known")] = 0


class LetterRef(msgspec.Struct, frozen=True, **WIRE_STRUCT):
    """A dead letter, named by where its message came from and its bytes' digest."""

    topic: Annotated[str, Meta(max_length=MAX_ID_CHARS)]
    partition: int | None = None
    offset: int | None = None
    sha256: Annotated[str, Meta(max_length=64)] = ""


class ReplayedMessage(Message, tag=WIRE_VERSION, kw_only=True):
    """Letters `relstream replay` sent back to their topics, at `at` (on the dead-letter
    topic; header `relstream-kind: replayed`)."""

    kind: ClassVar[str] = "replayed"
    letters: Annotated[list[LetterRef], Meta(min_length=1, max_length=MAX_MARKED)]
    to: NonEmpty  # what sent them: the command, for people
    at: Finite


def letter_ref(letter: DeadLetterMessage) -> LetterRef:
    return LetterRef(
        topic=letter.topic,
        partition=letter.partition,
        offset=letter.offset,
        sha256=letter.original_sha256,
    )
