"""The control topic as an engine reads it: every engine reads every control message (no
consumer group), from the earliest one kept, so a cancel reaches a relQuery still waiting
in Kafka too. An undecodable control message is dead-lettered and reading goes on.

A cancel is scoped (`Cancels`): it stops only a relQuery submitted before it was asked
(by the control record's Kafka timestamp against the later of the relQuery's
`submitted_at` and its own record's timestamp), and it is forgotten CANCEL_KEEP_S after it
was asked. So an id cancelled once (the HTTP door cancels after its 504; a client then
retries with the same id, or a dead letter is replayed with it) runs when submitted
again, and an engine that re-reads the topic from its start is not steered by old cancels.
The times compare the clocks of the processes that wrote the records: a resubmission
within the skew between their hosts' clocks of its cancel may still be cancelled.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator

from relstream.kafka.clients.aio import new_consumer, start_all
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.supervise import supervised
from relstream.wire import ControlMessage, MessageError
from relstream.wire.formats import decode_record

log = logging.getLogger("relstream.engine")

CANCEL_KEEP_S = 3600.0  # a cancel applies to relQueries taken within an hour of it
REMEMBERED_CANCELS = 100_000  # at most this many cancels kept, the oldest forgotten first


def record_time(record) -> float:
    """A Kafka record's timestamp in seconds since the epoch (0 where it has none)."""
    return max(record.timestamp, 0) / 1000


class Cancels:
    """The cancels asked, by relQuery id, with the time each was asked; and the time from
    which each relQuery being served counts as submitted."""

    def __init__(self, keep_s: float = CANCEL_KEEP_S, limit: int = REMEMBERED_CANCELS,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        self.keep_s = keep_s
        self.limit = limit
        self.clock = clock
        self._asked: OrderedDict[str, float] = OrderedDict()  # id -> asked at, oldest first
        self._serving: dict[str, float] = {}  # id -> submitted at, while it is served

    def add(self, relquery_id: str, at: float) -> bool:
        """Remember a cancel asked at `at`; False (forgotten at once) if it has expired."""
        if at < self.clock() - self.keep_s:
            return False
        self._asked[relquery_id] = max(at, self._asked.pop(relquery_id, at))
        while len(self._asked) > self.limit:
            self._asked.popitem(last=False)
        return True

    def covers(self, relquery_id: str, submitted_at: float | None = None) -> bool:
        """Whether a cancel stops the relQuery of this id submitted at `submitted_at`
        (None: the one being served under this id, if any)."""
        if submitted_at is None:
            submitted_at = self._serving.get(relquery_id)
        at = self._asked.get(relquery_id)
        if at is None or submitted_at is None:
            return False
        return submitted_at <= at and at >= self.clock() - self.keep_s

    @contextlib.contextmanager
    def serving(self, relquery_id: str, submitted_at: float) -> Iterator[None]:
        """The relQuery of this id, submitted at `submitted_at`, is served meanwhile."""
        self._serving[relquery_id] = submitted_at
        try:
            yield
        finally:
            self._serving.pop(relquery_id, None)


async def follow_control(*args, **kwargs) -> None:
    """`_follow_control`, restarted (logged, with backoff) if it dies."""
    await supervised("the control follower", lambda: _follow_control(*args, **kwargs))


async def _follow_control(
    bootstrap: str,
    topic: str,
    cancel: Callable[[str, float], Awaitable[None]],
    dead_letter: Callable[[object, str], Awaitable[None]],
    broker_kind: str | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """Call `cancel(relquery_id, asked_at)` for each cancel request on `topic`, until
    cancelled; a cancel that fails is logged and reading goes on."""
    consumer = new_consumer(
        bootstrap, topic, broker_kind=broker_kind, security=security, group_id=None
    )
    await start_all(consumer)
    try:
        async for message in consumer:
            try:
                request = decode_record(ControlMessage, message.value, message.headers)
            except MessageError as exc:
                await dead_letter(message, exc.reason)
                continue
            try:
                await cancel(request.cancel, record_time(message))
            except Exception:
                log.exception("could not cancel %s", request.cancel)
    finally:
        await consumer.stop()
