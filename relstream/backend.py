"""The one contract between the streaming service and whatever answers relQueries.

The vLLM runtime (`relstream.engine.runtime.VllmRuntime`) and the simulated backend
(`relstream.sim.backend.SimRelQueryBackend`) both satisfy it, so the Kafka service, the
benchmarks and the tests drive either without knowing which.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from relstream.model import RelQuery, RelQueryResult, RowResult
from relstream.placement.load import Load

BACKLOG_KV_MULTIPLE = 32  # the backlog holds this many KV-fulls of rows
TOKENS_PER_ROW = 512  # a row's prompt and answer, for sizing the backlog only


def backlog_rows_for(kv_capacity_tokens: int) -> int:
    """Rows to hand an engine whose KV holds `kv_capacity_tokens`: many more than fit at
    once (the scheduler orders them), never fewer than 256."""
    return max(256, BACKLOG_KV_MULTIPLE * kv_capacity_tokens // TOKENS_PER_ROW)


class EngineFailure(RuntimeError):
    """The engine itself failed (its core died, it stopped answering): nothing about the
    relQuery's rows. The service publishes nothing for the relQueries it was serving,
    commits nothing past them and exits, so a restarted engine answers them."""


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

        A row that cannot run (bad row, prompt too long, rejected by the engine's
        validation) is a row with status "error"; a cancelled row has status
        "cancelled". An engine failure raises EngineFailure and is never a row error."""
        ...

    async def cancel(self) -> None:
        """Stop the rows that have not finished; returns once they are stopped."""
        ...


@runtime_checkable
class RelQueryBackend(Protocol):
    """Something that serves relQueries: submit, then follow the handle."""

    model_name: str  # reported with every result

    @property
    def policy(self) -> str:
        """The scheduling policy that serves relQueries, reported with every result."""
        ...

    def backlog_rows(self) -> int:
        """How many rows it pays to hand this engine at once: enough that its scheduler
        sees a real backlog, few enough that waiting rows do not exhaust memory. Sized
        from the engine's KV capacity."""
        ...

    async def submit(self, relquery: RelQuery) -> RelQueryHandle:
        """Start serving `relquery`; returns at once with its handle. Rows that cannot run
        are reported through the handle, never raised here."""
        ...

    def load(self) -> Load | None:
        """Its load now, as its scheduler prices it, which the service reports for
        placement (`placement/reports.py`); None where it cannot tell one (the vLLM
        runtime before its plug-in's first write, a backend that does not price its
        work), and then it reports nothing."""
        ...

    def shutdown(self) -> None:
        """Release the engine. Idempotent."""
        ...


def missing_members(backend: object) -> list[str]:
    """What `backend` lacks of `RelQueryBackend`, each named as the contract names it
    (`load()` came a release after `submit`: a backend without it would stop the load
    reporter, not the engine, so `relstream engine` refuses it at start)."""
    members = [*RelQueryBackend.__annotations__, *(
        name for name, value in vars(RelQueryBackend).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    )]  # fmt: skip
    methods = vars(RelQueryBackend)
    return [f"{name}()" if callable(methods.get(name)) else name
            for name in members if not hasattr(backend, name)]  # fmt: skip


async def run(backend: RelQueryBackend, relquery: RelQuery) -> RelQueryResult:
    """Submit `relquery` and wait for its whole result."""
    return await (await backend.submit(relquery)).result()
