"""The client's reading of one topic: by a consumer group, from its committed offsets
(a sink's: each batch committed once the caller handled it), or with no group, from the
log start to the ends found when it began (`results`, `deadletters`).

A group reader is a static member (`kafka.membership.static`): the same reader run again
after a kill takes its partitions back at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from relstream.kafka.clients.aio import client_settings, portable_session
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.sync import sync_consumer
from relstream.kafka.membership.static import close_leaving, member_slot
from relstream.wire import Message, MessageError
from relstream.wire.formats import decode_record

M = TypeVar("M", bound=Message)
POLL_MS = 200
JOIN_TIMEOUT_S = 60.0  # a reader's group must hand it partitions within this
CLOSE_MS = 5000  # a group reader's close at most (kafka-python's 30 s left `sink` hanging)


class ResultsUnavailable(RuntimeError):
    """The results topic could not be read: the group never assigned a partition."""


class TopicReader:
    """Messages of a topic of the broker at `bootstrap`, decoded (`read`)."""

    def __init__(
        self, bootstrap: str, security: KafkaSecurity = PLAINTEXT, broker_kind: str | None = None
    ) -> None:
        self.bootstrap = bootstrap
        self.security = security
        self.broker_kind = broker_kind

    def read(
        self,
        topic: str,
        message_type: type[M],
        group: str | None,
        follow: bool,
        idle_seconds: float,
        on_unreadable: Callable[[int, str], None] | None = None,
        join_timeout: float = JOIN_TIMEOUT_S,
        may_commit: Callable[[], bool] = lambda: True,
        stop: Callable[[], bool] = lambda: False,
        on_caught_up: Callable[[], None] = lambda: None,
    ) -> Iterator[M]:
        """Messages of `topic` as in `results`; a batch is committed once handled, and only
        when `may_commit()` (a result's parts still missing hold the commit back). With no
        group, `on_caught_up()` runs once the ends found at the start are read."""
        if group is None:
            yield from self._look(
                topic, message_type, follow, idle_seconds, on_unreadable, stop, on_caught_up
            )
            return
        # A static member (as engines and workers are): the same reader run again after
        # a kill takes its partitions back at once, not after its session times out.
        slot = member_slot(self.bootstrap, group, self.broker_kind)
        consumer = None
        try:
            consumer = sync_consumer(
                self.bootstrap,
                security=self.security,
                group_id=group,
                group_instance_id=slot.instance_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest",
                **client_settings(self.broker_kind),
                **portable_session(self.broker_kind),
            )
            # The topic's partitions fetched before the first poll joins: joined without
            # them, kafka-python joins again once they come, and a poll that runs out
            # during that second join leaves it a member of nothing for good (3.0.12).
            consumer.subscribe([topic])
            consumer.partitions_for_topic(topic)
        except BaseException:
            if consumer is not None:  # made, then its metadata not had: closed, not left
                consumer.close(timeout_ms=CLOSE_MS)
            slot.release()
            raise
        try:
            started = time.monotonic()
            last: float | None = None  # the idle clock starts once partitions are assigned
            while not stop():
                batches = consumer.poll(timeout_ms=POLL_MS)
                now = time.monotonic()
                if batches or (last is None and consumer.assignment()):
                    last = now
                if batches:
                    yield from self._decoded(batches, message_type, on_unreadable)
                    if may_commit():
                        consumer.commit()
                elif last is None and now - started > join_timeout:
                    raise ResultsUnavailable(
                        f"group {group!r} was given no partition of {topic} within "
                        f"{join_timeout:g} s from {self.bootstrap}: a member that died "
                        "without leaving (a killed reader) holds them until the broker "
                        "expires it (its session timeout); read with a new group "
                        "(a sink's --group: a sink stores each result once)"
                    )
                elif not follow and last is not None and now - last >= idle_seconds:
                    return
        finally:
            close_leaving(consumer, CLOSE_MS)
            slot.release()

    def _look(
        self,
        topic: str,
        message_type: type[M],
        follow: bool,
        idle_seconds: float,
        on_unreadable: Callable[[int, str], None] | None,
        stop: Callable[[], bool] = lambda: False,
        on_caught_up: Callable[[], None] = lambda: None,
    ) -> Iterator[M]:
        """Messages of `topic` from its log start, with no consumer group: to the ends found
        at the start (true ends, `bounds.extents`), then on while following or until
        `idle_seconds` pass without a message."""
        from relstream.kafka.clients.bounds import Span, extents, partitions

        consumer = sync_consumer(self.bootstrap, security=self.security, enable_auto_commit=False)
        try:
            found = extents(consumer, partitions(consumer, [topic]))
            to_end = Span(consumer, {p: (e.start, e.end) for p, e in found.items()})
            last = time.monotonic()
            for record in to_end:
                if stop():
                    return
                last = time.monotonic()
                yield from self._decoded({None: [record]}, message_type, on_unreadable)
            on_caught_up()
            if not found or (not follow and idle_seconds <= 0):
                return
            consumer.assign(list(found))
            consumer.resume(*found)
            for partition, extent in found.items():
                consumer.seek(partition, extent.end)
            while not stop():
                batches = consumer.poll(timeout_ms=POLL_MS)
                if batches:
                    last = time.monotonic()
                    yield from self._decoded(batches, message_type, on_unreadable)
                elif not follow and time.monotonic() - last >= idle_seconds:
                    return
        finally:
            consumer.close()

    @staticmethod
    def _decoded(
        batches: dict, message_type: type[M], on_unreadable: Callable[[int, str], None] | None
    ) -> Iterator[M]:
        for records in batches.values():
            for record in records:
                try:
                    yield decode_record(message_type, record.value, record.headers)
                except MessageError as exc:
                    if on_unreadable:
                        on_unreadable(record.offset, exc.reason)
