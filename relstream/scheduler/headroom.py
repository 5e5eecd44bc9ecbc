"""Whether the stream leaves the engine capacity to spare for small batches.

Holding a relQuery back (the Δ gate, `gate.py`) shortens the relQueries ahead of it but
makes batches smaller, so each step's base is shared by fewer requests. That throughput
is only worth spending while the stream does not need it. Both sides are measured in
one unit, *full-batch work*: what a step's tokens would cost in a batch as full as seats
and KV allow (the online step-cost fit, `stepcost`):

    work(step) = a_p·U + (a_d + a_c·ctx)·D + b·D / n_full

with U uncached prompt tokens, D decodes, n_full the full batch. Then

    load ρ  = full-batch work the engine did per second, over the recent window
    yield e = full-batch work per second of the steps in which the gate held work back

A stable stream makes the engine do its arrivals' work, so ρ is the arrival rate of
work. Steps run at two yields (full-batch work per second of step): e_g in gated steps
that held work back, e_f in the others; a share φ of a gated engine's work runs in
held steps. Gating then keeps the engine busy a fraction

    r = ρ · (φ / e_g + (1 − φ) / e_f)

of the time, and is worth it while r < 1 − `margin`: the stream needs less than gated
steps deliver. As the backlog grows ρ rises, the gate opens and V1's full batches drain
it; once drained, ρ falls back to the arrival rate. The window spans the last `window`
relQuery arrivals, so it follows the stream's own time scale (seconds on a GPU, minutes
on this CPU) with no per-machine constant. Both yields and φ are measured, never
assumed, so a gate that costs little (a CPU, where each request pays its own way) stays
on at a load where a costly one (a step base shared by the batch) turns off.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

WINDOW = 256  # relQuery arrivals the load is measured over, at most
MIN_ARRIVALS = 32  # and at least, before it is trusted
MARGIN = 0.03  # share of capacity kept spare while gating: the gate closes above 1 − this
HYSTERESIS = 0.03  # and opens again only below 1 − MARGIN − this
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
    """The load the stream brings and what gated steps yield; `spare()` decides."""

    window: int = WINDOW
    margin: float = MARGIN
    hysteresis: float = HYSTERESIS
    gating: bool = True  # the decision in force
    _arrivals: deque[float] = field(default_factory=deque)
    _steps: deque[StepWork] = field(default_factory=deque)
    _work: float = 0.0  # sum of work over _steps
    _held: _Sums = field(default_factory=lambda: _Sums(YIELD_MEMORY))  # held steps
    _free: _Sums = field(default_factory=lambda: _Sums(YIELD_MEMORY))  # the other busy steps
    _gated: _Sums = field(default_factory=lambda: _Sums(YIELD_MEMORY))  # gated: (held work, work)

    def arrived(self, at: float) -> None:
        """A relQuery arrived at `at` (its arrival time)."""
        self._arrivals.append(at)
        while len(self._arrivals) > self.window:
            self._arrivals.popleft()

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
        return self._arrivals[0] if self._arrivals else float("-inf")

    def load(self, now: float) -> float | None:
        """ρ: full-batch work done per second since the window's first arrival (None
        until a window of arrivals and the steps across it were seen)."""
        if len(self._arrivals) < min(MIN_ARRIVALS, self.window) or not self._steps:
            return None
        span = now - self._arrivals[0]
        if span <= 0:
            return None
        return max(self._work, 0.0) / span

    def busy_when_gated(self, now: float) -> float | None:
        """r: the share of time a gated engine would be busy (None: no load yet)."""
        load = self.load(now)
        if load is None:
            return None
        e_free = self._free.ratio(1.0)
        e_held = self._held.ratio(e_free)
        phi = self._gated.ratio(0.0)
        return load * (phi / max(e_held, 1e-9) + (1 - phi) / max(e_free, 1e-9))

    def spare(self, now: float) -> bool:
        """Gate while a gated engine would still idle more than the margin; before a
        window of arrivals is seen, gate (an idle engine has capacity to spare). The
        yields and φ of the last gated steps are remembered while the gate is open, so
        a gate that cost too much is not tried again at the same load. Switching back
        needs `hysteresis` more room: a gate flapping on and off lets full batches form
        and loses what gating gains, at the cost of the throughput it spends."""
        busy = self.busy_when_gated(now)
        if busy is not None:
            threshold = 1 - self.margin - (0 if self.gating else self.hysteresis)
            self.gating = busy < threshold
        return self.gating


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
