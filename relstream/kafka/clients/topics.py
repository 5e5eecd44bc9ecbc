"""Topic names under a common prefix, and the partition counts they are created with."""

from __future__ import annotations

from dataclasses import dataclass

KEEP_DAYS = 7.0  # rows, relQueries, results, dead letters: a week, as Kafka keeps by default
SHORT_KEEP_MS = 24 * 3600 * 1000  # metrics (load reports among them), partial results: a day


@dataclass(frozen=True)
class Topics:
    """Topic names under a common prefix, with the partition counts they are created with."""

    prefix: str = "relstream."
    partitions: int = 4
    # How topics are created: -1 and 0 take the cluster's own `default.replication.factor`
    # and `min.insync.replicas` (never a hard-coded 1 on a cluster that replicates).
    replication: int = -1
    min_insync: int = 0

    def rows(self, table: str) -> str:
        return f"{self.prefix}rows.{table}"

    @property
    def relqueries(self) -> str:
        return f"{self.prefix}relqueries"

    @property
    def results(self) -> str:
        return f"{self.prefix}results"

    @property
    def partial_results(self) -> str:
        return f"{self.prefix}partial-results"

    @property
    def metrics(self) -> str:
        return f"{self.prefix}metrics"

    @property
    def deadletter(self) -> str:
        return f"{self.prefix}deadletter"

    @property
    def control(self) -> str:
        """Requests to the engines, e.g. to cancel a relQuery; every engine reads all."""
        return f"{self.prefix}control"

    @property
    def answers(self) -> str:
        """Answers of deterministic requests by digest (compacted): the answer cache's
        topic, created by the first engine that uses it."""
        return f"{self.prefix}answers"

    def layout(self, tables: tuple[str, ...] = ()) -> dict[str, int]:
        """Every topic with its partition count. relQuery ids key the work topics, so more
        partitions let more engine replicas share the load."""
        layout = {
            self.relqueries: self.partitions,
            self.results: self.partitions,
            self.partial_results: self.partitions,
            self.metrics: 1,
            self.deadletter: 1,
            self.control: 1,
        }
        layout.update({self.rows(table): self.partitions for table in tables})
        return layout

    def retention_ms(self, topic: str, keep_days: float = KEEP_DAYS) -> int:
        """How long an embedded broker keeps `topic`'s messages (`retention.ms`): what
        a sink or a restarted worker or engine may still need, `keep_days`; metrics and
        partial results, which nothing replays, a day."""
        if topic in (self.metrics, self.partial_results):
            return min(SHORT_KEEP_MS, int(keep_days * 86_400_000))
        return int(keep_days * 86_400_000)
