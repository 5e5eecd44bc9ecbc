"""Prometheus metrics of the engine service."""

from __future__ import annotations

import collections

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from relstream.kafka.delivery.publish import DROPPED
from relstream.model import RelQueryResult
from relstream.service.backlog import RowBudget
from relstream.wire.convert import usage_message
from relstream.wire.windowid import WindowId

LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000)
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# Distinct `query` label values an engine keeps (each a few series); later queries are
# counted under OTHER_QUERY, relQueries sent straight to the engine under DIRECT_QUERY.
MAX_QUERY_LABELS = 256
OTHER_QUERY, DIRECT_QUERY = "(other)", "(direct)"


class EngineMetrics:
    """One registry per service, so tests and several services in a process stay apart."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._lag_partitions: set[int] = set()  # partitions with a lag sample
        self.latency = Histogram(
            "relstream_relquery_latency_seconds",
            "relQuery latency by component (paper §2.1)",
            ["component"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.rows = Counter(
            "relstream_rows_total", "Rows answered, by status", ["status"], registry=self.registry
        )
        self.deadlines = Counter(
            "relstream_deadlines_total",
            "relQueries answered that set a deadline_s, by whether it was met",
            ["met"],
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "relstream_output_tokens_total",
            "Tokens generated (not those of rows answered from the cache or by an identical row)",
            registry=self.registry,
        )
        self.query_tokens = Counter(
            "relstream_query_tokens_total",
            "Tokens the engine computed, by query and kind: prompt, prefix_cached (of the "
            "prompt tokens, those vLLM's prefix cache held), output (docs/usage.md)",
            ["query", "kind"],
            registry=self.registry,
        )
        self.query_rows = Counter(
            "relstream_query_rows_total",
            "Rows answered, by query and by what answered them: engine (their own "
            "request), answer_cache, shared (an identical row's request)",
            ["query", "source"],
            registry=self.registry,
        )
        self.query_relqueries = Counter(
            "relstream_query_relqueries_total",
            "relQueries answered, by query",
            ["query"],
            registry=self.registry,
        )
        self._queries: set[str] = set()  # `query` label values in use
        self.tokens_per_second = Gauge(
            "relstream_output_tokens_per_second",
            "Output tokens generated per second of the last relQuery's service time",
            registry=self.registry,
        )
        self.in_flight = Gauge(
            "relstream_relqueries_in_flight", "relQueries being served", registry=self.registry
        )
        self.rows_in_flight = Gauge(
            "relstream_rows_in_flight",
            "Rows handed to the engine and not yet answered (the backlog it orders)",
            registry=self.registry,
        )
        self.consumer_lag = Gauge(
            "relstream_consumer_lag",
            "relQuery messages in Kafka the engine has not taken yet, by partition",
            ["partition"],
            registry=self.registry,
        )
        self.waiting_for_room = Gauge(
            "relstream_relqueries_waiting_for_room",
            "relQueries taken from Kafka that wait for room in the row budget",
            registry=self.registry,
        )
        self.dead_letters = Counter(
            "relstream_dead_letters_total",
            "Messages sent to the dead-letter topic",
            registry=self.registry,
        )
        self.replays_skipped = Counter(
            "relstream_replays_skipped_total",
            "relQuery messages handed back after a rebalance that this engine had answered",
            registry=self.registry,
        )
        self.dead_letter_failures = Counter(
            "relstream_dead_letter_failures_total",
            "Bad messages committed past whose dead letter the broker refused",
            registry=self.registry,
        )
        self.best_effort_dropped = Gauge(
            "relstream_best_effort_dropped",
            "Metrics, partial results and load reports dropped since the process started "
            "(not handed to the producer within 1 s, or not taken by the broker)",
            registry=self.registry,
        )
        self.best_effort_dropped.set_function(lambda: sum(DROPPED.values()))

        self.rows_cached = Counter(
            "relstream_rows_from_answer_cache_total",
            "Rows answered from the engine's answer cache, without running the model",
            registry=self.registry,
        )
        self.rows_shared = Counter(
            "relstream_rows_shared_total",
            "Rows answered by an identical row's request in flight, without one of their own",
            registry=self.registry,
        )
        self.tokens_reused = Counter(
            "relstream_output_tokens_reused_total",
            "Output tokens of rows answered without generating them, by source (cache, shared)",
            ["source"],
            registry=self.registry,
        )
        self.answer_cache = Gauge(
            "relstream_answer_cache",
            "The engine's answer cache: lookups that hit or missed, and bytes held",
            ["measure"],
            registry=self.registry,
        )
        self.answers_rejected = Counter(
            "relstream_answers_rejected_total",
            "Answers on the answers topic ignored: unsigned, forged (MAC mismatch), malformed",
            ["reason"],
            registry=self.registry,
        )

        self.loop_lag = Histogram(
            "relstream_event_loop_lag_seconds",
            "How late the engine's event loop woke a task sleeping 10 ms (service/looplag.py)",
            buckets=LOOP_LAG_BUCKETS,
            registry=self.registry,
        )
        self.partitions_revoked = Counter(
            "relstream_partitions_revoked_total",
            "relqueries partitions taken from this engine by a rebalance",
            registry=self.registry,
        )

    def observe_answer_cache(self, cache) -> None:
        """The engine's AnswerCache (relstream.engine.answers), where it has one."""
        for measure in ("hits", "misses", "bytes"):
            self.answer_cache.labels(measure).set(getattr(cache, measure))

    def observe_result(self, result: RelQueryResult, service_seconds: float) -> None:
        if result.latency is not None:
            for component, value in result.latency.as_dict().items():
                self.latency.labels(component).observe(value)
        by_status = collections.Counter(row.status for row in result.rows)
        for status, rows in by_status.items():
            self.rows.labels(status).inc(rows)
        cached = [row for row in result.rows if row.cached]
        shared = [row for row in result.rows if row.shared]
        self.rows_cached.inc(len(cached))
        self.rows_shared.inc(len(shared))
        self.tokens_reused.labels("cache").inc(sum(row.output_tokens for row in cached))
        self.tokens_reused.labels("shared").inc(sum(row.output_tokens for row in shared))
        usage = usage_message(result)
        tokens = usage.output_tokens
        self.output_tokens.inc(tokens)
        query = self._query_label(result.relquery_id)
        self.query_relqueries.labels(query).inc()
        for kind in ("prompt", "prefix_cached", "output"):
            self.query_tokens.labels(query, kind).inc(getattr(usage, f"{kind}_tokens"))
        engine = len(result.rows) - usage.answer_cached_rows - usage.shared_rows
        for source, rows in (
            ("engine", engine), ("answer_cache", usage.answer_cached_rows),
            ("shared", usage.shared_rows),
        ):  # fmt: skip
            self.query_rows.labels(query, source).inc(rows)
        if result.deadline_met is not None:
            self.deadlines.labels("true" if result.deadline_met else "false").inc()
        if service_seconds > 0:
            self.tokens_per_second.set(tokens / service_seconds)

    def _query_label(self, relquery_id: str) -> str:
        """The registered query a relQuery came from, as a label (bounded in number)."""
        window = WindowId.parse(relquery_id)
        if window is None:
            return DIRECT_QUERY
        if window.query not in self._queries and len(self._queries) >= MAX_QUERY_LABELS:
            return OTHER_QUERY
        self._queries.add(window.query)
        return window.query

    def observe_backlog(self, budget: RowBudget) -> None:
        self.in_flight.set(budget.relqueries)
        self.rows_in_flight.set(budget.in_flight)
        self.waiting_for_room.set(len(budget.waiting))

    def observe_lag(self, lag_by_partition: dict[int, int]) -> None:
        """The lag of the partitions assigned now; a partition that moved to another
        engine leaves this one's metrics, so the lags summed over engines stay true."""
        for gone in self._lag_partitions - lag_by_partition.keys():
            self.consumer_lag.remove(str(gone))
        for partition, lag in lag_by_partition.items():
            self.consumer_lag.labels(str(partition)).set(lag)
        self._lag_partitions = set(lag_by_partition)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)


async def consumer_lag(consumer) -> dict[int, int]:
    """Per partition assigned to `consumer`: messages past its position (the lag gauge)."""
    lag = {}
    for partition in consumer.assignment():
        highwater = consumer.highwater(partition)
        if highwater is not None:
            position = await consumer.position(partition)
            lag[partition.partition] = max(highwater - position, 0)
    return lag
