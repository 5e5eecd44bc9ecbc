"""A result too big for one Kafka message, in parts, and back.

The engine splits a result's rows over as many messages as its size needs, each under the
producer's request limit (`split_result`); every reader joins them (`ResultJoiner`)
before a user sees the result, so a sink stores one whole result per relQuery id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from relstream.wire.formats import Format, encode_as
from relstream.wire.messages import ResultMessage, ResultRow

_ROW_ENCODERS = {"msgpack": msgspec.msgpack.Encoder(), "json": msgspec.json.Encoder()}


def split_result(
    message: ResultMessage, max_bytes: int, fmt: Format = "msgpack"
) -> list[ResultMessage]:
    """`message` as parts whose size encoded in `fmt` stays under `max_bytes` (one part
    when it fits). A single row larger than the bound travels alone in its part."""
    envelope = len(encode_as(msgspec.structs.replace(message, rows=[]), fmt))
    encoder = _ROW_ENCODERS[fmt]

    def _row_bytes(row: ResultRow) -> int:
        return len(encoder.encode(row)) + 1  # and a byte of the array's length or a comma

    if envelope + sum(_row_bytes(row) for row in message.rows) <= max_bytes:
        return [message]
    groups: list[list[ResultRow]] = [[]]
    size = envelope
    for row in message.rows:
        row_size = _row_bytes(row)
        if groups[-1] and size + row_size > max_bytes:
            groups.append([])
            size = envelope
        groups[-1].append(row)
        size += row_size
    return [
        msgspec.structs.replace(message, rows=rows, part=index, parts=len(groups))
        for index, rows in enumerate(groups)
    ]


# Results read after a set's last part, beyond which the set is taken as stale: one
# engine publishes a result's parts back to back, so a set waiting this long will not
# be completed (its writer died between parts and the relQuery was answered another way).
# Counted over every partition a reader reads: between two ~1 MiB parts of one partition
# it may read thousands of small results of others, so the bound is wide.
STALE_AFTER = 100_000


@dataclass
class ResultJoiner:
    """Parts of results as they are read, in any order and repeated (at-least-once);
    `add` answers the whole result once its last missing part arrives. A set whose id
    is answered whole, or that waited `stale_after` messages, is dropped: it would hold
    back a reader's commit for ever (issue 48, item 9)."""

    stale_after: int = STALE_AFTER
    _waiting: dict[str, dict[int, ResultMessage]] = field(default_factory=dict)
    _last: dict[str, int] = field(default_factory=dict)  # id -> `_read` at its last part
    _read: int = 0

    def add(self, message: ResultMessage) -> ResultMessage | None:
        self._read += 1
        if self._waiting and self._read % 256 == 0:
            self._drop_stale()
        if message.parts == 1:  # whole: parts of an earlier try of it are stale
            self._forget(message.id)
            return message
        if message.part >= message.parts:  # no such part (a forgery or a writer's bug)
            return None
        parts = self._waiting.setdefault(message.id, {})
        self._last[message.id] = self._read
        if parts and next(iter(parts.values())).parts != message.parts:
            parts.clear()  # served again and split otherwise: start over from this one
        parts[message.part] = message
        if len(parts) < message.parts:
            return None
        self._forget(message.id)
        rows = [row for index in range(message.parts) for row in parts[index].rows]
        return msgspec.structs.replace(parts[0], rows=rows, part=0, parts=1)

    def _forget(self, relquery_id: str) -> None:
        self._waiting.pop(relquery_id, None)
        self._last.pop(relquery_id, None)

    def _drop_stale(self) -> None:
        for relquery_id, last in list(self._last.items()):
            if self._read - last > self.stale_after:
                self._forget(relquery_id)

    @property
    def pending(self) -> bool:
        """Some result has parts read and parts still missing."""
        if self._waiting:
            self._drop_stale()
        return bool(self._waiting)
