"""A synchronous Python client for notebooks and scripts, on kafka-python.

    client = RelstreamClient("localhost:9092")
    client.produce_rows("reviews", [{"key": "r1", "values": {"review": "Dry feet."}}])
    result = client.ask("Is this review positive? {review}", rows, timeout=60)
    for result in client.results(follow=True): ...

It speaks the wire contract of every relstream process (`relstream.wire`), for callers
that are not asyncio programs: `relstream produce`, `results` and `sink` use it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import msgspec

from relstream.kafka.clients.aio import MAX_REQUEST_BYTES
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.sync import (
    AckedPrefix,
    BrokerUnavailable,
    sync_consumer,
    sync_producer,
)
from relstream.kafka.clients.topics import Topics
from relstream.model import RelQuery, Row, Template
from relstream.outputspec import OutputSpec, Sampling
from relstream.placement.book import placement_of
from relstream.placement.readers import LoadReader
from relstream.reader import JOIN_TIMEOUT_S, POLL_MS, ResultsUnavailable, TopicReader
from relstream.wire import (
    ControlMessage,
    DeadLetterMessage,
    ResultMessage,
    RowMessage,
    encode,
)
from relstream.wire.convert import relquery_message
from relstream.wire.formats import Format, decode_record
from relstream.wire.letters import ReplayedMessage
from relstream.wire.messages import MAX_ROW_BYTES
from relstream.wire.parts import ResultJoiner

__all__ = ["BrokerUnavailable", "RelstreamClient", "ResultsUnavailable"]



class RelstreamClient:
    def __init__(
        self,
        bootstrap: str,
        prefix: str = "relstream.",
        security: KafkaSecurity = PLAINTEXT,
        broker_kind: str | None = None,
        placement: str | None = None,
    ) -> None:
        """`placement`: "load" sends each relQuery to the least loaded engine while engines
        report their load, else by its id's hash; "hash" always by the hash (unset:
        $RELSTREAM_PLACEMENT, else "load"; docs/operations.md, Scale-out)."""
        self.bootstrap = bootstrap
        self.topics = Topics(prefix)
        self.security = security
        self.broker_kind = broker_kind
        self.placement = placement_of(placement)
        self._producer = sync_producer(bootstrap, security, acks="all", linger_ms=5)
        self._acked = AckedPrefix()  # of the rows `produce_rows` sent last
        self._submitted: dict[str, dict] = {}  # relQuery id -> results offsets before it
        self._placer: LoadReader | None = None  # started by the first submit
        self._reader = TopicReader(bootstrap, security, broker_kind)

    def produce_rows(
        self,
        table: str,
        rows: Iterable[RowMessage | Mapping[str, Any]],
        on_sent: Callable[[], None] | None = None,
        stop: Callable[[], bool] = lambda: False,
    ) -> int:
        """Send rows (RowMessages, or {"key": ..., "values": {...}} mappings) to the
        table's rows topic; returns how many once the broker has them all, or, once
        `stop()` is true, how many were sent (`acknowledged`: how many it has)."""
        topic = self.topics.rows(table)
        self._acked = acked = AckedPrefix()
        sent = 0
        for row in rows:
            if stop():
                return sent
            if not isinstance(row, RowMessage):
                row = RowMessage(table=table, key=str(row["key"]), values=dict(row["values"]))
            value = encode(row)
            if len(value) > MAX_ROW_BYTES:  # the worker would only dead-letter it
                raise ValueError(
                    f"row {row.key!r} is {len(value):,} bytes encoded; a row is at most "
                    f"{MAX_ROW_BYTES:,} ({sent} rows before it were sent)"
                )
            future = self._producer.send(topic, value, key=row.key.encode())
            future.add_callback(lambda _metadata, index=sent: acked.add(index))
            sent += 1
            if on_sent:
                on_sent()
        self._producer.flush()
        return sent

    def acknowledged(self, wait_s: float = 0.0) -> int:
        """How many rows, from the first, of the last `produce_rows` the broker has (after
        up to `wait_s` for those in flight): so many can be left out when sent again."""
        return self._acked.prefix_after(self._producer, wait_s)

    def submit(
        self,
        template: str,
        rows: Iterable[Row | Mapping[str, Any]],
        *,
        relquery_id: str | None = None,
        max_output_tokens: int = 16,
        system_prompt: str | None = None,
        output: OutputSpec | None = None,
        sampling: Sampling | None = None,
        cache_salt: str | None = None,
        deadline_s: float | None = None,
        result_format: Format | None = None,
    ) -> str:
        """Send an ad-hoc relQuery (one answer per row); returns its id for `result`.
        `cache_salt`, a tenant's: relQueries of other salts never share its answers.
        `deadline_s`: wanted within this many seconds (the result says if it was).
        `result_format`: "json" for a JSON result (unset: the engine's choice)."""
        relquery = RelQuery(
            relquery_id or f"adhoc-{uuid.uuid4().hex[:12]}",
            Template(template),
            [row if isinstance(row, Row) else Row(str(row["key"]), row["values"]) for row in rows],
            max_output_tokens,
            system_prompt,
            output=output,
            sampling=sampling or Sampling(),
            cache_salt=cache_salt,
            deadline_s=deadline_s,
        )
        message = relquery_message(relquery)
        if result_format is not None:
            message = msgspec.structs.replace(message, result_format=result_format)
        value = encode(message)
        if len(value) > MAX_REQUEST_BYTES:
            raise ValueError(
                f"relQuery {relquery.id!r} is {len(value):,} bytes encoded; a Kafka message is "
                f"at most {MAX_REQUEST_BYTES:,} here (brokers' default): send its rows in "
                "several relQueries"
            )
        # Where the results stand now: the answer can only come after.
        self._submitted[relquery.id] = self._result_ends()
        # Placement picks only the partition, once: the producer's retries keep it.
        partition = self._partition_for(message)
        future = self._producer.send(
            self.topics.relqueries, value, key=relquery.id.encode(), partition=partition
        )
        future.get(timeout=30)
        return relquery.id

    def _partition_for(self, message) -> int | None:
        """Where placement by load sends it; None: by its key's hash."""
        if self.placement != "load":
            return None
        if self._placer is None:
            self._placer = LoadReader(self.bootstrap, self.topics, self.security)
        return self._placer.partition_for(message)

    def cancel(self, relquery_id: str) -> None:
        """Ask the engines to stop a relQuery; its result still comes, rows "cancelled"."""
        message = encode(ControlMessage(cancel=relquery_id))
        self._producer.send(self.topics.control, message).get(timeout=30)

    def result(self, relquery_id: str, timeout: float = 60.0) -> ResultMessage:
        """Block until the result of a relQuery this client submitted arrives."""
        starts = self._submitted.get(relquery_id)
        if starts is None:
            raise KeyError(f"relQuery {relquery_id!r} was not submitted by this client")
        consumer = sync_consumer(self.bootstrap, security=self.security, enable_auto_commit=False)
        try:
            consumer.assign(list(starts))
            for partition, offset in starts.items():
                consumer.seek(partition, offset)
            deadline = time.monotonic() + timeout
            joiner = ResultJoiner()
            while time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=POLL_MS).values():
                    for record in records:
                        if record.key != relquery_id.encode():
                            continue
                        message = decode_record(ResultMessage, record.value, record.headers)
                        whole = joiner.add(message)
                        if whole is not None:
                            self._submitted.pop(relquery_id, None)
                            return whole
        finally:
            consumer.close()
        raise TimeoutError(f"no result for relQuery {relquery_id!r} after {timeout:g} s")

    def ask(self, template: str, rows, timeout: float = 60.0, **options) -> ResultMessage:
        """Submit a relQuery and wait for its result."""
        return self.result(self.submit(template, rows, **options), timeout)

    def results(
        self,
        group: str | None = None,
        follow: bool = False,
        idle_seconds: float = 3.0,
        on_unreadable: Callable[[int, str], None] | None = None,
        join_timeout: float = JOIN_TIMEOUT_S,
        stop: Callable[[], bool] = lambda: False,
        before_commit: Callable[[], None] = lambda: None,
        on_caught_up: Callable[[], None] = lambda: None,
    ) -> Iterator[ResultMessage]:
        """Results from the group's committed offsets, committing each batch once the
        caller asked for the next, so only what it handled; with no group, every result
        from the beginning, joining no consumer group (none is left behind). Unless
        following, ends once the topic's ends at the start are read and `idle_seconds`
        passed after the last result (0: at those ends), the idle clock counted from when
        the group gave this reader its partitions (a join takes seconds on some brokers);
        raises ResultsUnavailable if the group gives it none within `join_timeout`. An
        unreadable result is skipped, reported to `on_unreadable(offset, reason)`. Ends,
        following or not, at the first poll (every POLL_MS) after `stop()` is true.
        `before_commit()` runs before each commit (a sink makes what it stored durable);
        with no group, `on_caught_up()` once the ends found at the start are read."""
        joiner = ResultJoiner()  # a big result comes in parts: the user sees it whole

        def may_commit() -> bool:
            if joiner.pending:
                return False
            before_commit()
            return True

        messages = self._reader.read(
            self.topics.results,
            ResultMessage,
            group,
            follow,
            idle_seconds,
            on_unreadable,
            join_timeout,
            may_commit,
            stop,
            on_caught_up,
        )
        for message in messages:
            whole = joiner.add(message)
            if whole is not None:
                yield whole

    def dead_letters(
        self,
        follow: bool = False,
        idle_seconds: float = 3.0,
        stop: Callable[[], bool] = lambda: False,
    ) -> Iterator[DeadLetterMessage]:
        """Every dead letter from the beginning (no consumer group), as `results`."""
        topic = self.topics.deadletter
        yield from self._reader.read(
            topic, DeadLetterMessage, None, follow, idle_seconds, stop=stop
        )

    def replay_marks(self, stop: Callable[[], bool] = lambda: False) -> Iterator[ReplayedMessage]:
        """The marks `relstream replay` left on the dead-letter topic, to its end now."""
        topic = self.topics.deadletter
        yield from self._reader.read(topic, ReplayedMessage, None, False, 0, stop=stop)

    def _result_ends(self) -> dict:
        from kafka import TopicPartition

        consumer = sync_consumer(self.bootstrap, security=self.security)
        try:
            partitions = consumer.partitions_for_topic(self.topics.results) or set()
            return consumer.end_offsets(
                [TopicPartition(self.topics.results, p) for p in sorted(partitions)]
            )
        finally:
            consumer.close()

    def close(self) -> None:
        self._producer.close()
        if self._placer is not None:
            self._placer.close()

    def __enter__(self) -> RelstreamClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
