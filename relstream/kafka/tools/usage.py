"""What each query cost over a period, read from the metrics topic (`relstream usage`).

Every engine publishes one `metrics` message per relQuery it answered, with its `usage`
(docs/usage.md), committed with the result. This reader joins no consumer group: it
finds each partition's first record at or after `since` by time (ListOffsets by
timestamp), reads to the ends found at its start (committed records only), keeps the
messages whose `at` falls in the period and sums them by query, the name a window's
relQuery id carries (`wire.windowid`). Memory: one row of sums per query, at most
MAX_QUERIES (later ones summed as OTHER); records are read and dropped a batch at a time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from relstream.kafka.clients.bounds import Span, extents, partitions
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.sync import sync_consumer
from relstream.kafka.clients.topics import Topics
from relstream.wire import MessageError, MetricsMessage
from relstream.wire.formats import decode_record, is_load_report
from relstream.wire.windowid import WindowId

MAX_QUERIES = 10_000
OTHER, DIRECT = "(other)", "(direct)"  # past MAX_QUERIES; relQueries not a window's


@dataclass
class QueryUsage:
    """One query's relQueries over the period, their rows and the tokens they took."""

    query: str
    relqueries: int = 0
    rows: int = 0
    prompt_tokens: int = 0
    prefix_cached_tokens: int = 0
    output_tokens: int = 0
    answer_cached_rows: int = 0
    shared_rows: int = 0
    uncounted: int = 0  # relQueries whose engine sent no usage (an older release)

    def add(self, message: MetricsMessage) -> None:
        self.relqueries += 1
        self.rows += sum(message.rows.values())
        usage = message.usage
        if usage is None:
            self.uncounted += 1
            self.output_tokens += message.output_tokens
            return
        self.prompt_tokens += usage.prompt_tokens
        self.prefix_cached_tokens += usage.prefix_cached_tokens
        self.output_tokens += usage.output_tokens
        self.answer_cached_rows += usage.answer_cached_rows
        self.shared_rows += usage.shared_rows

    @property
    def prefix_cached_share(self) -> float:
        """Of the prompt tokens, the share vLLM's prefix cache held."""
        return self.prefix_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def answer_cached_share(self) -> float:
        """Of the rows, the share the answer cache answered."""
        return self.answer_cached_rows / self.rows if self.rows else 0.0


@dataclass
class UsageReport:
    since: float
    until: float
    queries: dict[str, QueryUsage] = field(default_factory=dict)
    read: int = 0  # metrics records read (load reports and other programs' included)
    unreadable: int = 0  # records on the topic that are no metrics message of ours
    unread: list[str] = field(default_factory=list)  # partitions not read to their end

    def add(self, message: MetricsMessage) -> None:
        window = WindowId.parse(message.relquery_id)
        query = DIRECT if window is None else window.query
        if query not in self.queries and len(self.queries) >= MAX_QUERIES:
            query = OTHER
        self.queries.setdefault(query, QueryUsage(query)).add(message)

    def total(self) -> QueryUsage:
        total = QueryUsage("total")
        for usage in self.queries.values():
            for name in vars(total):
                if name != "query":
                    setattr(total, name, getattr(total, name) + getattr(usage, name))
        return total


def summarize(
    report: UsageReport, records: Iterable, progress: Callable[[int], None] = lambda n: None
) -> UsageReport:
    """Add `records` (of the metrics topic) in the report's period to `report`."""
    for record in records:
        report.read += 1
        if report.read % 10_000 == 0:
            progress(report.read)
        if is_load_report(record.headers):
            continue
        try:
            message = decode_record(MetricsMessage, record.value, record.headers)
        except MessageError:
            report.unreadable += 1
            continue
        if report.since <= message.at < report.until:
            report.add(message)
    return report


def usage_by_query(
    bootstrap: str,
    topics: Topics,
    since: float,
    until: float | None = None,
    security: KafkaSecurity = PLAINTEXT,
    progress: Callable[[int], None] = lambda n: None,
) -> UsageReport:
    """The metrics topic's relQueries answered from `since` to `until` (seconds since the
    epoch; None: now), summed by query."""
    until = time.time() if until is None else until
    report = UsageReport(since, until)
    consumer = sync_consumer(bootstrap, security=security, enable_auto_commit=False)
    try:
        parts = partitions(consumer, [topics.metrics])
        if not parts:
            return report
        found = extents(consumer, parts)
        # A record is stamped when it is produced, a moment after its `at`: a minute
        # earlier is surely before the period's first relQuery.
        starts = consumer.offsets_for_times({p: max(0, int((since - 60) * 1000)) for p in parts})
        bounds = {}
        for p, extent in found.items():
            start = starts.get(p)
            first = extent.stable if start is None else max(start.offset, extent.start)
            bounds[p] = (first, extent.stable)
        span = Span(consumer, bounds)
        summarize(report, span, progress)
        report.unread = sorted(f"{p.topic}[{p.partition}]" for p in span.unread)
    finally:
        consumer.close()
    return report
