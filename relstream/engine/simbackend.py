"""`--backend sim`: the engine interface without a model, for instant runs and tests.

Each row's output is its rendered prompt (so where an answer lands shows which row it
came from); the latency breakdown is what the simulator predicts for the relQuery alone
on a cost profile. Rows fail for the same reasons as on the real engine.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from relstream.engine.kvcache import block_hashes
from relstream.engine.profiles import get_profile
from relstream.engine.runtime import RelQueryHandle, RelQueryResult, RowResult
from relstream.engine.sim import SimRelQuery, SimRequest, SimulatedEngine
from relstream.model import RelQuery, RowError
from relstream.scheduler import make_policy
from relstream.tokenizer import chatml_prompt, encode_batch


@dataclass(frozen=True)
class SimSettings:
    policy: str = "relserve"
    profile: str = "cpu-smollm2"
    time_scale: float = 0.0  # > 0: take this fraction of the simulated latency in real time


class SimRelQueryBackend:
    model_name = "sim"

    def __init__(self, settings: SimSettings | None = None) -> None:
        self.settings = settings or SimSettings()
        self.profile = get_profile(self.settings.profile)

    async def submit(self, relquery: RelQuery) -> RelQueryHandle:
        handle = SimHandle(relquery, time.monotonic())
        handle.outcome = asyncio.ensure_future(self._serve_in_time(relquery))
        return handle

    async def _serve_in_time(self, relquery: RelQuery) -> RelQueryResult:
        result = await asyncio.get_running_loop().run_in_executor(None, self._serve, relquery)
        if self.settings.time_scale > 0 and result.latency is not None:
            await asyncio.sleep(result.latency.total * self.settings.time_scale)
        return result

    async def run(self, relquery: RelQuery) -> RelQueryResult:
        return await (await self.submit(relquery)).result()

    def shutdown(self) -> None:
        """Nothing to release."""

    def _serve(self, relquery: RelQuery) -> RelQueryResult:
        rows: list[RowResult] = []
        prompts: dict[int, str] = {}
        for index, row in enumerate(relquery.rows):
            if not any(str(v).strip() for v in row.values.values() if v is not None):
                rows.append(RowResult(index, row.key, "error", error=f"row {row.key!r} is empty"))
                continue
            try:
                prompts[index] = relquery.template.render(row.values)
            except RowError as exc:
                rows.append(RowResult(index, row.key, "error", error=f"row {row.key!r}: {exc}"))
                continue
            rows.append(RowResult(index, row.key, "ok", prompts[index], None, 1))
        latency = self._simulate(relquery, prompts) if prompts else None
        return RelQueryResult(relquery.id, rows, latency, self.settings.policy, self.model_name)

    def _simulate(self, relquery: RelQuery, prompts: dict[int, str]):
        ids = encode_batch([chatml_prompt(p, relquery.system_prompt) for p in prompts.values()])
        block = self.profile.limits.block_size
        requests = [
            SimRequest(
                f"{relquery.id}#{i}", len(t), block_hashes(t, block), relquery.max_output_tokens
            )
            for i, t in zip(prompts, ids, strict=True)
        ]
        engine = SimulatedEngine(
            self.profile, make_policy(self.settings.policy, self.profile.prior())
        )
        run = engine.run([SimRelQuery(relquery.id, 0.0, relquery.max_output_tokens, requests)])
        return run.outcomes[0].latency


class SimHandle(RelQueryHandle):
    outcome: asyncio.Future

    async def rows(self):
        for row in (await self.result()).rows:
            yield row

    async def result(self) -> RelQueryResult:
        return await self.outcome

    async def cancel(self) -> None:
        self.outcome.cancel()
