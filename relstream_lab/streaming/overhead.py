"""The Kafka path's overhead at one load, from interleaved runs.

The streaming benchmark runs direct, Kafka, direct, Kafka, ..., direct on one engine.
Each Kafka run is set against the mean of the two direct runs beside it, so a machine
that drifts during the benchmark drifts out of the ratio; the overhead is the mean of
these paired ratios, with a Student-t 95 % interval over them. At a load where the
engine queues, one run's mean moves by more than the goal, so only the interval says
whether a goal is met.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t for 1..10 degrees of freedom; more degrees
# reuse the last, which widens the interval slightly (never narrows it). A table, not
# scipy: ten constants do not justify a 40 MB dependency in every environment.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


@dataclass(frozen=True)
class Overhead:
    paired: tuple[float, ...]  # per Kafka run: its mean latency / its neighbours' mean - 1
    mean: float  # the mean of `paired`: the overhead reported
    low: float | None  # 95 % interval over `paired`; None with a single Kafka run
    high: float | None

    def established_below(self, goal: float) -> bool:
        """Whether the whole interval lies under `goal` (never with one Kafka run)."""
        return self.high is not None and self.high < goal


def paired_overhead(direct: Sequence[float], kafka: Sequence[float]) -> Overhead:
    """Overhead of `kafka` mean latencies over the `direct` ones run around them:
    direct[i] ran before kafka[i] and direct[i + 1] after it."""
    if len(direct) != len(kafka) + 1 or not kafka:
        raise ValueError(
            f"need one more direct run than Kafka runs, got {len(direct)} and {len(kafka)}"
        )
    paired = tuple(run / ((direct[i] + direct[i + 1]) / 2) - 1.0 for i, run in enumerate(kafka))
    mean = statistics.fmean(paired)
    if len(paired) < 2:
        return Overhead(paired, mean, None, None)
    quantile = T_975[min(len(paired) - 1, len(T_975)) - 1]
    half = quantile * statistics.stdev(paired) / math.sqrt(len(paired))
    return Overhead(paired, mean, mean - half, mean + half)
