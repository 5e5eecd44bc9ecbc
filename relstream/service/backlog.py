"""How much work the engine service takes from Kafka: a budget of rows in flight.

The scheduler can only reorder what the engine holds, so the service hands the engine
its whole backlog, up to a budget of rows sized from the engine's KV
(`RelQueryBackend.backlog_rows`) and a configured cap, so memory stays bounded however
far the stream runs ahead. relQueries taken from Kafka beyond the budget wait here, in
arrival order, with their partitions paused.

No relQuery is charged more than a quarter of the budget: a table larger than that (or
than the whole budget) is handed over beside the others instead of alone, so the
scheduler sees the small relQueries behind it and can serve them first. The engine then
holds at most the budget plus the rows of the few large relQueries charged partly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

Item = TypeVar("Item")

DEFAULT_MAX_BACKLOG_ROWS = 20_000  # the configured cap's default
LARGEST_SHARE = 4  # no relQuery is charged more than 1/4 of the budget


@dataclass
class RowBudget(Generic[Item]):
    """Rows in flight against a budget, and the decoded relQueries waiting for room."""

    rows: int  # the budget
    in_flight: int = 0  # rows handed to the engine and not yet answered
    relqueries: int = 0  # relQueries handed to the engine and not yet answered
    waiting: deque[tuple[int, Item]] = field(default_factory=deque)  # (charge, item)

    def charge(self, rows: int) -> int:
        """What a relQuery of `rows` rows counts against the budget."""
        return min(rows, max(self.rows // LARGEST_SHARE, 1))

    def offer(self, rows: int, item: Item) -> None:
        self.waiting.append((self.charge(rows), item))

    def admit(self) -> list[Item]:
        """The waiting items that fit now, in order."""
        admitted = []
        while self.waiting:
            charged, item = self.waiting[0]
            if self.in_flight and self.in_flight + charged > self.rows:
                break
            self.waiting.popleft()
            self.in_flight += charged
            self.relqueries += 1
            admitted.append(item)
        return admitted

    def release(self, rows: int) -> None:
        """A relQuery of `rows` rows was answered."""
        self.in_flight -= self.charge(rows)
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
