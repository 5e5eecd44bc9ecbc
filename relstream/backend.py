"""The one contract between the streaming service and whatever answers relQueries.

The vLLM runtime (`relstream.engine.runtime.RelQueryEngine`) and the simulated backend
(`relstream.sim.backend.SimRelQueryBackend`) both satisfy it, so the Kafka service, the
benchmarks and the tests drive either without knowing which.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from relstream.model import RelQuery, RelQueryResult, RowResult


@runtime_checkable
class RelQueryHandle(Protocol):
    """One submitted relQuery."""

    @property
    def relquery_id(self) -> str: ...

    def rows(self) -> AsyncIterator[RowResult]:
        """Each row once, in the order rows finish. A backend that only knows the whole
        result yields its rows when it has it."""
        ...

    async def result(self) -> RelQueryResult:
        """Every row, in row order, with the latency breakdown; waits for the last row.

        A row that cannot run is a row with status "error"; an engine failure raises."""
        ...

    async def cancel(self) -> None:
        """Stop the rows that have not finished; returns once they are stopped."""
        ...


@runtime_checkable
class RelQueryBackend(Protocol):
    """Something that serves relQueries: submit, then follow the handle."""

    model_name: str  # reported with every result

    async def submit(self, relquery: RelQuery) -> RelQueryHandle:
        """Start serving `relquery`; returns at once with its handle. Rows that cannot run
        are reported through the handle, never raised here."""
        ...

    def shutdown(self) -> None:
        """Release the engine. Idempotent."""
        ...


async def run(backend: RelQueryBackend, relquery: RelQuery) -> RelQueryResult:
    """Submit `relquery` and wait for its whole result."""
    return await (await backend.submit(relquery)).result()
