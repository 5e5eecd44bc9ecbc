"""How much work the engine service takes from Kafka: a budget of rows in flight.

The scheduler can only reorder what the engine holds, so the service hands the engine
its whole backlog, up to a budget of rows sized from the engine's KV
(`RelQueryBackend.backlog_rows`) and a configured cap, so memory stays bounded however
far the stream runs ahead. relQueries taken from Kafka beyond the budget wait here, in
arrival order, with their partitions paused.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")

DEFAULT_MAX_BACKLOG_ROWS = 20_000  # the configured cap's default


@dataclass
class RowBudget(Generic[Item]):
    """Rows in flight against a budget, and the decoded relQueries waiting for room."""

    rows: int  # the budget
    in_flight: int = 0  # rows handed to the engine and not yet answered
    relqueries: int = 0  # relQueries handed to the engine and not yet answered
    waiting: deque[tuple[int, Item]] = field(default_factory=deque)  # (rows, item)

    def offer(self, rows: int, item: Item) -> None:
        self.waiting.append((rows, item))

    def admit(self) -> list[Item]:
        """The waiting items that fit now, in order. One bigger than the whole budget is
        admitted alone, when nothing else is in flight, so it is never stuck."""
        admitted = []
        while self.waiting:
            rows, item = self.waiting[0]
            if self.in_flight and self.in_flight + rows > self.rows:
                break
            self.waiting.popleft()
            self.in_flight += rows
            self.relqueries += 1
            admitted.append(item)
        return admitted

    def release(self, rows: int) -> None:
        self.in_flight -= rows
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
