"""How much work the engine service takes from Kafka: a budget of rows in flight.

The scheduler can only reorder what the engine holds, so the service hands the engine
its whole backlog, up to a budget of rows sized from the engine's KV
(`RelQueryBackend.backlog_rows`) and a configured cap, so memory stays bounded however
far the stream runs ahead. relQueries taken from Kafka beyond the budget wait here, in
arrival order, with their partitions paused.

No relQuery is charged more than a quarter of the budget: a table larger than that (or
than the whole budget) is handed over beside the others instead of alone, so the
scheduler sees the small relQueries behind it and can serve them first.

What bounds memory is the rows the engine holds, not their charge: besides the budget,
the rows handed over and not yet answered never exceed `held_limit` (by default the
budget plus one largest relQuery, `MAX_RELQUERY_ROWS`), unless nothing is in flight. The
service decodes no further message while one waits here (it seeks its partition back and
pauses it), so at most one decoded relQuery waits: the engine holds at most
`held_limit + MAX_RELQUERY_ROWS` decoded rows, whatever the topic holds.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from relstream.wire.messages import MAX_RELQUERY_ROWS

Item = TypeVar("Item")

DEFAULT_MAX_BACKLOG_ROWS = 20_000  # the configured cap's default
FETCH_RECORDS = 64  # records taken from the fetched ones per poll
LETTERS_IN_FLIGHT = 16  # dead letters of undecodable relQueries on their way, at most
LETTER_BYTES_IN_FLIGHT = 16 * 2**20  # and the bytes of the messages they hold, at most
LARGEST_SHARE = 4  # no relQuery is charged more than 1/4 of the budget


@dataclass
class RowBudget(Generic[Item]):
    """Rows in flight against a budget, and the decoded relQueries waiting for room."""

    rows: int  # the budget
    in_flight: int = 0  # rows charged for relQueries handed over and not yet answered
    relqueries: int = 0  # relQueries handed to the engine and not yet answered
    waiting: deque[tuple[int, Item]] = field(default_factory=deque)  # (rows, item)
    held_limit: int = 0  # cap on rows (not charges) handed over; 0: rows + MAX_RELQUERY_ROWS
    held: int = 0  # rows handed to the engine and not yet answered

    def __post_init__(self) -> None:
        if self.held_limit <= 0:
            self.held_limit = self.rows + MAX_RELQUERY_ROWS

    def charge(self, rows: int) -> int:
        """What a relQuery of `rows` rows counts against the budget."""
        return min(rows, max(self.rows // LARGEST_SHARE, 1))

    def offer(self, rows: int, item: Item) -> None:
        self.waiting.append((rows, item))

    def admit(self) -> list[Item]:
        """The waiting items that fit now, in order."""
        admitted = []
        while self.waiting:
            rows, item = self.waiting[0]
            charged = self.charge(rows)
            if self.relqueries and (
                self.in_flight + charged > self.rows or self.held + rows > self.held_limit
            ):
                break
            self.waiting.popleft()
            self.in_flight += charged
            self.held += rows
            self.relqueries += 1
            admitted.append(item)
        return admitted

    def release(self, rows: int) -> None:
        """A relQuery of `rows` rows was answered."""
        self.in_flight -= self.charge(rows)
        self.held -= rows
        self.relqueries -= 1

    def drop_waiting(self, keep) -> int:
        """Forget waiting items `keep(item)` rejects (their partition was revoked)."""
        before = len(self.waiting)
        self.waiting = deque((rows, item) for rows, item in self.waiting if keep(item))
        return before - len(self.waiting)

    @property
    def full(self) -> bool:
        """Stop fetching: relQueries already wait for room."""
        return bool(self.waiting)


class LettersInFlight:
    """Dead letters on their way to the broker: each holds its message until the broker
    has it, so their count and bytes are bounded; past either, no more is fetched."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task] = set()
        self.bytes = 0

    @property
    def full(self) -> bool:
        return len(self.tasks) >= LETTERS_IN_FLIGHT or self.bytes >= LETTER_BYTES_IN_FLIGHT

    def add(self, task: asyncio.Task, message) -> None:
        size = len(message.value or b"")
        self.tasks.add(task)
        self.bytes += size

        def done(_: asyncio.Task) -> None:
            self.tasks.discard(task)
            self.bytes -= size

        task.add_done_callback(done)

    async def wait(self, timeout: float) -> None:
        """Until one is delivered, or `timeout` seconds."""
        await asyncio.wait(self.tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
