"""How much the stream needs the engine's throughput: the load that weighs the Δ gate.

Holding a relQuery back (the Δ gate, `gate.py`) shortens the relQueries ahead of it but
makes batches smaller, so each step's base is shared by fewer requests: capacity is
lost. What a second of lost capacity costs depends on the load. Both sides are measured
in one unit, *full-batch work*: what a step's tokens would cost in a batch as full as
seats and KV allow (the online step-cost fit, `stepcost`):

    work(step) = a_p·U + (a_d + a_c·ctx)·D + b·D / n_full

with U uncached prompt tokens, D decodes, n_full the full batch. Then

    load ρ = full-batch work the engine did per second over the last `window` arrivals,
             times the rows that arrived in them over the rows that finished (a backlog
             that grows means the stream brought more than the engine did)
    yields e_g, e_f = full-batch work per second of step, in gated steps that held work
             back and in the others; φ = the share of a gated engine's work held

A gated engine is then busy a share r = ρ · (φ / e_g + (1 − φ) / e_f) of the time. A
second of capacity lost now delays everything queued (the Δ gate counts those) and every
relQuery that arrives before the backlog B (engine seconds of work left, all relQueries)
is cleared; at arrival rate λ that is λ·B of them at today's pace, and more as the load
stretches the drain (a busy period lasts 1 / (1 − r) times its work). `pressure` counts

    λ · B / (1 − r)^k,   k = STRETCH

beside the queue: near 0 when the backlog is short, however busy the stream (the paper's
Δ in a lull), and past any bound as r nears 1 or the backlog grows (V1's full batches).
k = 1 prices the whole stretch and k = 0 none; k is one constant for every machine,
chosen on the sustained benchmark (docs/benchmarks/sustained/notes.md: the sweep). The
window follows the stream's own time scale (seconds on a GPU, minutes on this CPU); the
yields and φ are measured, never assumed, so a gate that costs little (each request pays
its own way) holds work back at a load where a costly one (a step base shared by the
batch) no longer does.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 256  # relQuery arrivals the load is measured over, at most
MIN_ARRIVALS = 8  # and at least, before it is trusted
STRETCH = 0.75  # k: how much of the busy period's stretch a lost second is charged
GROWTH_CAP = 2.0  # bound on rows arrived over rows finished in the window
MAX_BUSY = 0.999  # r is capped here: the pressure is then 10⁶ relQueries, V1's batches
YIELD_MEMORY = 1024  # steps of each kind the yields and φ are measured over


@dataclass(frozen=True)
class StepWork:
    """One executed step in full-batch work (engine seconds) and its duration."""

    at: float  # when it ended
    work: float
    duration: float
    held: bool  # the gate held work back in this step
    gated: bool = False  # the step was planned with the gate


@dataclass
class Headroom:
    """The load the stream brings and what gated steps yield; `pressure()` weighs."""

    window: int = WINDOW
    stretch: float = STRETCH  # k
    _arrivals: deque[tuple[float, int]] = field(default_factory=deque)  # (at, rows)
    _arrived_rows: int = 0  # sum of rows over _arrivals
    _finished: deque[tuple[float, int]] = field(default_factory=deque)  # (at, rows)
    _finished_rows: int = 0  # sum of rows over _finished
    _steps: deque[StepWork] = field(default_factory=deque)
    _work: float = 0.0  # sum of work over _steps
    _held: _Sums = field(default_factory=lambda: _Sums(YIELD_MEMORY))  # held steps
    _free: _Sums = field(default_factory=lambda: _Sums(YIELD_MEMORY))  # the other busy steps
    _gated: _Sums = field(default_factory=lambda: _Sums(YIELD_MEMORY))  # gated: (held work, work)

    def arrived(self, at: float, rows: int) -> None:
        """A relQuery of `rows` rows arrived at `at` (its arrival time)."""
        self._arrivals.append((at, rows))
        self._arrived_rows += rows
        while len(self._arrivals) > self.window:
            self._arrived_rows -= self._arrivals.popleft()[1]

    def finished(self, at: float, rows: int) -> None:
        """A relQuery of `rows` rows finished at `at`."""
        self._finished.append((at, rows))
        self._finished_rows += rows
        self._drop_finished()

    def _drop_finished(self) -> None:
        """Finishes before the window's first arrival leave (they come in time order)."""
        start = self._start()
        while self._finished and self._finished[0][0] < start:
            self._finished_rows -= self._finished.popleft()[1]

    def executed(self, step: StepWork) -> None:
        """A step ran; steps begun before the window's first arrival drop out."""
        self._steps.append(step)
        self._work += step.work
        start = self._start()
        while self._steps and self._steps[0].at - self._steps[0].duration < start:
            self._work -= self._steps.popleft().work
        if step.duration > 0:
            (self._held if step.held else self._free).add(step.work, step.duration)
        if step.gated:
            self._gated.add(step.work if step.held else 0.0, step.work)

    def _start(self) -> float:
        return self._arrivals[0][0] if self._arrivals else float("-inf")

    def load(self, now: float) -> float | None:
        """ρ: full-batch work done per second since the window's first arrival (None
        until a window of arrivals and the steps across it were seen)."""
        if len(self._arrivals) < min(MIN_ARRIVALS, self.window) or not self._steps:
            return None
        span = now - self._start()
        if span <= 0:
            return None
        self._drop_finished()
        finished = self._finished_rows
        growth = min(max(self._arrived_rows / max(finished, 1), 1 / GROWTH_CAP), GROWTH_CAP)
        if len(self._arrivals) < self.window:
            growth = 1.0  # the window still holds the stream's start, its queue filling
        return max(self._work, 0.0) / span * growth

    def busy_when_gated(self, now: float) -> float | None:
        """r: the share of time a gated engine would be busy (None: no load yet)."""
        load = self.load(now)
        if load is None:
            return None
        e_free = self._free.ratio(1.0)
        e_held = self._held.ratio(e_free)
        phi = self._gated.ratio(0.0)
        return load * (phi / max(e_held, 1e-9) + (1 - phi) / max(e_free, 1e-9))

    def rate(self, now: float) -> float:
        """λ: relQueries arrived per second over the window."""
        span = now - self._start()
        return len(self._arrivals) / span if span > 0 else 0.0

    def pressure(self, now: float, backlog: float) -> float:
        """Relqueries a second of lost capacity delays beyond those queued, with
        `backlog` engine seconds of work left: λ · B / (1 − r)^k. 0 before a window of
        arrivals is seen (the paper's Δ)."""
        busy = self.busy_when_gated(now)
        if busy is None:
            return 0.0
        busy = min(busy, MAX_BUSY)
        return self.rate(now) * backlog / (1 - busy) ** self.stretch


@dataclass
class _Sums:
    """Sums of (numerator, denominator) pairs over the last `size` added."""

    size: int
    pairs: deque[tuple[float, float]] = field(default_factory=deque)
    top: float = 0.0
    bottom: float = 0.0

    def add(self, top: float, bottom: float) -> None:
        self.pairs.append((top, bottom))
        self.top += top
        self.bottom += bottom
        if len(self.pairs) > self.size:
            old_top, old_bottom = self.pairs.popleft()
            self.top -= old_top
            self.bottom -= old_bottom

    def ratio(self, default: float) -> float:
        return self.top / self.bottom if self.bottom > 1e-12 else default
