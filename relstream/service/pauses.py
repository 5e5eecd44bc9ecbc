"""Which relqueries partitions the engine stops fetching, and why.

Two reasons pause a partition (aiokafka `consumer.pause`; it stays assigned and in the
group, nothing exits):

- **The row budget is full**: relQueries already wait for room, so every assigned
  partition pauses until some finish (`backlog.RowBudget`).
- **The broker does not take a result or dead letter** of the partition's work: its
  delivery stalled (`kafka.delivery.publish.publish_acked`). The partition's offset cannot be
  committed past that relQuery, so taking more of its work would only pile up answers
  in memory. It resumes once every held delivery of it is acknowledged.

The held deliveries keep their rows counted in the row budget until the broker has them,
so what an outage holds in memory is bounded by the budget (`--max-backlog-rows`). Each
change of the held partitions is one log line: the pause, and the resume with how long
it lasted.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator

log = logging.getLogger("relstream.engine")


class Pauses:
    """The partitions held by undelivered work, and the pauses applied to a consumer."""

    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._held: Counter = Counter()  # partition -> its deliveries waiting for the broker
        self._paused: set = set()  # partitions this consumer has paused
        self._since = 0.0  # when the current outage (some partition held) began
        self._delivered = 0  # held deliveries acknowledged since it began
        self._on_change = on_change

    @property
    def held(self) -> set:
        return set(self._held)

    @contextlib.contextmanager
    def holding(self, partition) -> Iterator[Callable[[], None]]:
        """A `stalled` callback for one delivery of `partition`'s work: its first call
        holds the partition; leaving the block releases it (delivered, or given up)."""
        taken = False

        def stalled() -> None:
            nonlocal taken
            if taken:
                return
            taken = True
            if not self._held:
                self._since, self._delivered = time.monotonic(), 0
            new = partition not in self._held
            self._held[partition] += 1
            if new:
                log.warning(
                    "pausing relqueries partition %s: the broker does not acknowledge its "
                    "results or dead letters; %d held in memory, re-published with backoff",
                    _name(partition),
                    self._held.total(),
                )
                self._on_change()

        try:
            yield stalled
        finally:
            if taken:
                self._release(partition)

    def _release(self, partition) -> None:
        self._held[partition] -= 1
        self._delivered += 1
        if self._held[partition] > 0:
            return
        del self._held[partition]
        left = f"; still paused: {', '.join(map(_name, self._held))}" if self._held else ""
        log.warning(
            "resuming relqueries partition %s: the broker acknowledges again (held for "
            "%.1f s; %d held results and dead letters delivered)%s",
            _name(partition),
            time.monotonic() - self._since,
            self._delivered,
            left,
        )
        self._on_change()

    def apply(self, consumer, budget_full: bool) -> None:
        """Pause and resume `consumer`'s partitions to match: all while the budget is full,
        else those held. Only changes are sent: resuming on every poll would restart
        fetches in a busy loop."""
        assignment = set(consumer.assignment())
        wanted = assignment if budget_full else self.held & assignment
        pause = wanted - self._paused
        resume = (self._paused - wanted) & assignment
        if pause:
            consumer.pause(*pause)
        if resume:
            consumer.resume(*resume)
        self._paused = wanted

    def revoked(self) -> None:
        """A rebalance: the new assignment starts resumed (held partitions of it pause
        again at the next `apply`)."""
        self._paused = set()


def _name(partition) -> str:
    return str(getattr(partition, "partition", partition))
