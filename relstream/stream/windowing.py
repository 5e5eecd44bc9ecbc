"""Rows → relQueries: validation of each row, the cut of each input partition into
windows, and the relQuery built from a window.

Windows are per input partition and cut from the records alone, so a worker that replays
a partition after a crash cuts the same windows under the same ids:

- a window starts at the first valid row after the previous window and takes the rows
  that follow in offset order while fewer than `max_rows` and while each row's own
  timestamp is under the first row's plus `window_seconds`;
- its id is (registration, partition, first offset, first row's timestamp):
  `<name>-<partition>-<offset>@<milliseconds>`. The offset alone repeats when a topic is
  re-created (a memory-only broker restarted, a topic deleted and made again) and its
  offsets start at 0 again; the first record's Kafka timestamp tells that incarnation
  from the old one, and is the same on a replay, so a replayed window keeps its id. Ids
  of earlier releases (`<name>-<partition>-<offset>`) are plain strings to every reader.

A live worker cannot know that no more rows of a window will come until it sees a row
past the deadline; with none, it closes the window once its own clock is `lateness`
seconds past the deadline. A row timestamped before the deadline but appended after that
(a producer more than `lateness` late) goes to the next window live but would join this
one on a replay: the only case where a replay could cut differently. A broker outage
makes every producer late, and the rebalance after it replays what was not committed, so
a worker remembers the windows it has published and not yet committed past
(`published`: a window's `start`, its first offset and first row's time → its last
offset) and cuts a replay of one at the same row; only a
restarted worker, which has forgotten them, can still cut differently.

A window also closes before the row that would take its relQuery message over
`message_bytes`, the largest message the broker takes on the relqueries topic (the stage
reads it from the broker when it starts: `kafka.clients.limits`), so no valid row can make a
message the broker refuses. The cut sums each row's own encoded size in the relQuery
(`row_bytes`: exact, a row is encoded once, never the whole window again) against a budget
fixed when the cutter is made (`rows_budget`): `message_bytes` less `ENVELOPE_BYTES` for the
Kafka record around the value, less the relQuery's fields besides its rows (template,
system prompt, output spec..., with the longest id a window can have). A row that alone
exceeds the budget is refused (dead-lettered, naming the row and the limit). The budget
is the same on every run while the broker's limit and the registration are: a broker whose
limit was changed (or a worker given another) may cut a replay differently, like a late
row above.

So an open window holds at most `max_rows` rows and at most the budget (under 1 MiB by
Kafka's default) of encoded rows; its decoded rows take a few times that in memory.

Kept free of Faust and Kafka so the rules are tested directly; the worker only feeds it.
"""

from __future__ import annotations

import time
from array import array
from dataclasses import dataclass, field

import msgspec

from relstream.stream.columns import hint, lacking
from relstream.stream.registrations import QueryRegistration
from relstream.wire import MessageError, RelQueryMessage, RelQueryRow, RowMessage, encode
from relstream.wire.convert import output_message, sampling_fields
from relstream.wire.formats import Headers, decode_record
from relstream.wire.messages import MAX_PRIORITY, MAX_ROW_BYTES
from relstream.wire.windowid import WindowId

# Kafka's default message limit, and relstream producers' request limit
# (`kafka.clients.aio.MAX_REQUEST_BYTES`): the bound where none is given.
MESSAGE_BYTES = 1_048_576
# Room in a message for what is not the relQuery's value: its key (the id, at most 1 KiB
# in UTF-8), headers (none today), the record's varints and the record batch's 61 bytes.
ENVELOPE_BYTES = 4096
_ROWS_HEADER_BYTES = 5  # msgpack's array header for the rows: 1 byte when empty, at most 5
_ENCODER = msgspec.msgpack.Encoder()
# A RelQueryRow's own bytes besides its key and values: a 2-entry map and the two names.
_ROW_FRAME_BYTES = (
    len(_ENCODER.encode(RelQueryRow(key="k", values={})))
    - len(_ENCODER.encode("k"))
    - len(_ENCODER.encode({}))
)


@dataclass(frozen=True)
class RowRejection:
    reason: str


def check_row(
    registration: QueryRegistration, raw: bytes | None, headers: Headers = None
) -> RowMessage | RowRejection:
    """A row message usable by this registration, or why it is not; msgpack or JSON, as
    its headers or its first byte say (`wire.formats`)."""
    if raw is not None and len(raw) > MAX_ROW_BYTES:
        return RowRejection(f"row is {len(raw)} bytes; the limit is {MAX_ROW_BYTES}")
    try:
        row = decode_record(RowMessage, raw, headers)
    except MessageError as exc:
        return RowRejection(str(exc))
    if row.table != registration.table:
        return RowRejection(
            f"row of table {row.table!r} on the topic of table {registration.table!r}"
        )
    missing = lacking(needed_columns(registration), row.values)
    if missing:
        names = ", ".join("{" + c + "}" for c in missing)
        return RowRejection(
            f"row {row.key!r} lacks column(s) {names} that query {registration.name!r} uses"
            + hint(missing, row.values)
        )
    return row


def needed_columns(registration: QueryRegistration) -> tuple[str, ...]:
    """The columns each row must have: its template's, or its free fields."""
    return (*registration.template.columns, *registration.fields)


def window_priority(registration: QueryRegistration, first_ms: int, now: float) -> int:
    """The class of a window's relQuery: its registration's, one below where its first
    row is older than `backfill_after_s` (rows a reset or a replay reads again, or a
    backlog), so live windows go first (`scheduler.classes`)."""
    after = registration.backfill_after_s
    old = after is not None and now - first_ms / 1000 > after
    return max(registration.priority - 1, -MAX_PRIORITY) if old else registration.priority


def relquery_for_window(
    registration: QueryRegistration,
    rows: list[RowMessage],
    window_id: WindowId,
    priority: int | None = None,
) -> RelQueryMessage:
    """The relquery message for one window's rows (of class `priority`, the
    registration's unless given). `window_id` is the same when the window is replayed
    after a crash, so consumers de-duplicate on the id."""
    return RelQueryMessage(
        id=window_id.format(),
        template=registration.template.text,
        rows=[RelQueryRow(key=row.key, values=row.values) for row in rows],
        system_prompt=registration.system_prompt,
        max_output_tokens=registration.max_output_tokens,
        submitted_at=time.time(),
        output=None if registration.output is None else output_message(registration.output),
        fields=list(registration.fields) or None,
        deadline_s=registration.deadline_s,
        result_format=registration.result_format,
        priority=registration.priority if priority is None else priority,
        **sampling_fields(registration.sampling),
    )


def row_bytes(row: RowMessage) -> int:
    """The bytes `row` takes in its window's relQuery (a `RelQueryRow`, msgpack): its key
    and values encoded, no other copy made."""
    return _ROW_FRAME_BYTES + len(_ENCODER.encode(row.key)) + len(_ENCODER.encode(row.values))


def rows_budget(registration: QueryRegistration, message_bytes: int) -> int:
    """The bytes a window's rows may take (`row_bytes` summed) so that its relQuery, with
    the longest id a window can have, and its Kafka envelope fit in `message_bytes`."""
    # The longest id, and the class that encodes longest (msgpack: -100 takes 2 bytes).
    longest = WindowId(registration.name, 2**31 - 1, 2**63 - 1, -(2**63 - 1))  # most digits
    frame = relquery_for_window(registration, [], longest, -MAX_PRIORITY)
    fixed = len(encode(frame)) - 1 + _ROWS_HEADER_BYTES  # the empty list's header was 1 byte
    return message_bytes - ENVELOPE_BYTES - fixed


@dataclass
class Window:
    """Valid rows of one input partition, from `first_offset` to `last_offset`."""

    partition: int
    first_offset: int
    deadline: float  # the first row's timestamp plus the window's seconds
    rows: list[RowMessage]
    last_offset: int
    first_ms: int  # the first row's timestamp in milliseconds: names the topic's incarnation
    offsets: array = field(default_factory=lambda: array("q"))  # each row's, as `rows`
    rows_bytes: int = 0  # `row_bytes` summed over `rows`

    @property
    def start(self) -> tuple[int, int]:
        """Its first offset and first row's milliseconds: where it starts in which
        incarnation of the topic (offsets alone repeat once a topic is made again)."""
        return self.first_offset, self.first_ms

    def window_id(self, query: str) -> WindowId:
        """Its relQuery's id as `query`'s window: unique across incarnations of the
        topic, the same on a replay (module doc)."""
        return WindowId(query, self.partition, self.first_offset, self.first_ms)


class PartitionWindows:
    """Cuts one input partition, fed its records in offset order, into windows."""

    def __init__(
        self,
        registration: QueryRegistration,
        partition: int,
        published: dict[tuple[int, int], int] | None = None,
        message_bytes: int = MESSAGE_BYTES,
    ) -> None:
        self.registration = registration
        self.partition = partition
        self.message_bytes = message_bytes
        self.budget = rows_budget(registration, message_bytes)
        self.open: Window | None = None
        self.next_offset: int | None = None  # just past the last record fed
        # windows already on the broker, first offset -> last: a replay ends them there
        self.published = published if published is not None else {}

    def check(
        self, raw: bytes | None, headers: Headers = None
    ) -> tuple[RowMessage, int] | RowRejection:
        """`check_row`, then the row's bytes in a relQuery (`row_bytes`), or why no window
        can hold it: alone it is over the budget."""
        row = check_row(self.registration, raw, headers)
        if isinstance(row, RowRejection):
            return row
        size = row_bytes(row)
        if size > self.budget:
            return RowRejection(
                f"row {row.key!r} takes {size} bytes in a relQuery; a relQuery of query "
                f"{self.registration.name!r} has room for {max(self.budget, 0)} bytes of rows "
                f"(the broker's message limit, {self.message_bytes} bytes, less its template, "
                "settings and envelope)"
            )
        return row, size

    def add(
        self, offset: int, timestamp: float, row: RowMessage | None, size: int | None = None
    ) -> list[Window]:
        """Feed one record (`row` None: a rejected one) with its Kafka timestamp in
        seconds, and the row's `row_bytes` (None: measured here; a row over the budget
        must have been refused by `check`). Returns the windows it closed: the open one if
        this row is past its deadline or would take it over the budget, and this row's own
        if it filled it. The first row's timestamp also names its window, so it must be
        the record's own (a record of a pre-0.10 message format has none; the worker gives
        it its clock, and a replay names that window anew)."""
        self.next_offset = offset + 1
        if row is None:
            return []
        size = row_bytes(row) if size is None else size
        closed = []
        if self.open is not None and (
            timestamp >= self.open.deadline
            or self.open.rows_bytes + size > self.budget
            or offset > self.published.get(self.open.start, offset)
        ):
            closed.append(self.open)
            self.open = None
        if self.open is None:
            deadline = timestamp + self.registration.window_seconds
            first_ms = round(timestamp * 1000)  # the record's own: a float of its ms
            self.open = Window(self.partition, offset, deadline, [], offset, first_ms)
        self.open.rows.append(row)
        self.open.offsets.append(offset)
        self.open.rows_bytes += size
        self.open.last_offset = offset
        if len(self.open.rows) >= self.registration.max_rows:
            closed.append(self.open)
            self.open = None
        return closed

    def expire(self, now: float, lateness: float) -> Window | None:
        """The open window, closed, once `now` is `lateness` past its deadline (a replay
        of a published window only once it has all its rows again)."""
        window = self.open
        if window is not None and window.last_offset < self.published.get(window.start, -1):
            return None
        if window is not None and now >= window.deadline + lateness:
            self.open = None
            return window
        return None

    def committable(self) -> int | None:
        """The offset a consumer may commit: the open window's start (it is replayed),
        else just past the last record fed."""
        return self.open.first_offset if self.open is not None else self.next_offset
