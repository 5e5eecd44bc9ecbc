"""How late the event loop wakes: a task that sleeps a short interval and records by
how much each wake-up missed it. Whatever held the loop (a long decode, a big result
encoded in one go) shows up here as lag, and so do stopped Kafka heartbeats."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

PROBE_INTERVAL_S = 0.01


class LoopLagProbe:
    """Run `await probe.run()` as a task on the loop to watch; `worst` is the largest lag
    seen (seconds), `observe` (a histogram's, say) gets every sample."""

    def __init__(
        self,
        interval_s: float = PROBE_INTERVAL_S,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.observe = observe
        self.worst = 0.0
        self.samples = 0

    async def run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            lag = max(time.perf_counter() - asked - self.interval_s, 0.0)
            self.samples += 1
            self.worst = max(self.worst, lag)
            if self.observe is not None:
                self.observe(lag)

    def reset(self) -> None:
        self.worst = 0.0
        self.samples = 0
