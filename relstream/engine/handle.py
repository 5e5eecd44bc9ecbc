"""Service process: a relQuery on the vLLM runtime (`engine/runtime.py`), on its loop.

One asyncio task per row, its rows as they finish, its result, its cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from relstream.backend import EngineFailure
from relstream.engine.requests import breakdown
from relstream.model import RelQuery, RelQueryResult, RowResult


@dataclass
class EngineHandle:
    """A relQuery on the vLLM engine: one task per row."""

    relquery: RelQuery
    submitted_at: float
    policy: str
    model: str
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _finished: asyncio.Queue = field(default_factory=asyncio.Queue)  # RowResult | EngineFailure

    @property
    def relquery_id(self) -> str:
        return self.relquery.id

    async def rows(self) -> AsyncIterator[RowResult]:
        """Rows in the order they finish; raises EngineFailure if the engine fails."""
        for _ in range(len(self._tasks)):
            finished = await self._finished.get()
            if isinstance(finished, EngineFailure):
                raise finished
            yield finished

    async def result(self) -> RelQueryResult:
        outcomes = await asyncio.gather(*self._tasks)
        rows = sorted((row for row, _ in outcomes), key=lambda r: r.row_index)
        times = [t for _, t in outcomes if t is not None]
        return RelQueryResult(
            self.relquery.id,
            rows,
            breakdown(self.submitted_at, times),
            self.policy,
            self.model,
        )

    async def cancel(self) -> None:
        """Abort the unfinished rows; `result()` then has them as "cancelled" beside the
        rows that had finished."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
