"""Publishing that outlasts a broker outage, for the messages an offset commit waits on.

A relQuery's offset (the engine) or a window's rows (the worker) may be committed only
once its result, relQuery or dead letter is on the broker. So those messages are sent
until the broker acknowledges them: a send that fails because the broker cannot be
reached (or does not answer in time) is sent again, the same bytes, after a capped
exponential backoff, for as long as the outage lasts. Only a refusal for good (the
message too large for the broker, no such topic allowed, no authorisation) ends the
tries, as `Refused`: waiting would not help, and the caller decides.

`publish_acked` calls `stalled()` once a message has waited `stall_s` without an
acknowledgement, or at its first failed try, so the caller can stop taking new work
(pause its input partitions) well before the client's own request timeout; the caller
resumes when the call returns.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    KafkaUnavailableError,
)

from relstream.kafka.clients.loglimit import InOurWords, RateLimited

log = logging.getLogger("relstream.kafka.delivery.publish")

STALL_S = 5.0  # unacknowledged this long: the broker is taken to be out
BEST_EFFORT_WAIT_S = 1.0  # the longest a best-effort message waits to be handed over
DROPPED: Counter[str] = Counter()  # best-effort messages dropped, by topic


@dataclass(frozen=True)
class Send:
    """One message to publish, among those answering one input message."""

    topic: str
    value: bytes
    key: bytes | None
    what: str  # names it in log lines
    headers: list[tuple[str, bytes]] | None = None
    partition: int | None = None  # None: the key's hash


class Refused(Exception):
    """The broker refused a message for good: sending it again would not help. `what`
    names the refused message where several were sent together (a transaction)."""

    def __init__(self, message: str, what: str | None = None) -> None:
        super().__init__(message)
        self.what = what


@dataclass(frozen=True)
class Backoff:
    """Waits between tries: `first_s`, doubled after each failed try, at most `cap_s`."""

    first_s: float = 0.5
    cap_s: float = 10.0

    def after(self, tries: int) -> float:
        """The wait after `tries` failed tries (1 for the first)."""
        return min(self.first_s * 2 ** (tries - 1), self.cap_s)


def unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the broker (or a partition's leader) cannot be reached now, so a
    later try may succeed; False for a refusal of this message itself."""
    if isinstance(exc, KafkaTimeoutError | KafkaConnectionError | KafkaUnavailableError):
        return True
    return isinstance(exc, KafkaError) and bool(getattr(exc, "retriable", False))


async def publish_acked(
    producer: AIOKafkaProducer,
    topic: str,
    value: bytes,
    key: bytes | None,
    what: str,
    stalled: Callable[[], None] = lambda: None,
    stall_s: float = STALL_S,
    backoff: Backoff = Backoff(),
    headers: list[tuple[str, bytes]] | None = None,
    partition: int | None = None,
) -> int:
    """Send `value` to `topic` until the broker acknowledges it; returns the tries it took.
    Raises `Refused` if the broker refuses it for good. `what` names it in the log lines,
    which go through the log rate limit (`loglimit.RateLimited`). `partition`: where it
    goes, kept for every try (None: by its key's hash)."""
    timer = asyncio.get_running_loop().call_later(stall_s, stalled)
    tries = 0
    try:
        while True:
            tries += 1
            try:
                sent = producer.send(topic, value, key=key, headers=headers, partition=partition)
                await (await sent)
                return tries
            except (AssertionError, ValueError, TypeError) as exc:
                # Not the broker's answer but the client's: a partition it does not know
                # (one a forged load report named, or one added since its metadata was
                # read) fails an assertion in aiokafka. The key's hash chooses instead;
                # with no partition given it is refused, never an unforeseen crash.
                if partition is None:
                    raise Refused(f"the producer could not send {what}: {exc!r}") from exc
                log.warning("could not send %s to partition %d of %s (%r); sent by its "
                            "key's hash instead", what, partition, topic, exc)  # fmt: skip
                partition = None
                tries -= 1  # the client's error: no try reached the broker
                continue
            except KafkaError as exc:
                if not unavailable(exc):
                    raise Refused(f"the broker refused {what}: {exc!r}") from exc
                stalled()
                wait = backoff.after(tries)
                log.warning(
                    "could not publish %s to %s (%s); held, next try in %.1f s",
                    what,
                    topic,
                    type(exc).__name__,
                    wait,
                )
                await asyncio.sleep(wait)
    finally:
        timer.cancel()


async def publish_sends(
    producer: AIOKafkaProducer,
    sends: list[Send],
    stalled: Callable[[], None] = lambda: None,
    stall_s: float = STALL_S,
) -> None:
    """`publish_acked` each of `sends`, in order, each to its own partition if it names
    one (a relQuery placed by load)."""
    for send in sends:
        await publish_acked(
            producer, send.topic, send.value, send.key, send.what, stalled, stall_s,
            headers=send.headers, partition=send.partition,
        )  # fmt: skip


async def publish_best_effort(
    producer: AIOKafkaProducer,
    topic: str,
    value: bytes,
    key: bytes | None,
    headers: list[tuple[str, bytes]] | None = None,
    wait_s: float = BEST_EFFORT_WAIT_S,
) -> bool:
    """Hand `value` to the producer and go on: for messages nothing waits on (metrics,
    partial results). The hand-over waits at most `wait_s` (during an outage the client
    would wait for the topic's metadata or buffer room up to its request timeout, 40 s);
    one not handed over in time or not taken by the broker is dropped, logged
    (rate-limited) and counted in `DROPPED` by topic, never retried. False if dropped
    before it was handed over."""

    def settled(sent: asyncio.Future) -> None:
        if not sent.cancelled() and sent.exception() is not None:
            _drop(topic, sent.exception())

    try:
        async with asyncio.timeout(wait_s):
            sent = await producer.send(topic, value, key=key, headers=headers)
    except (KafkaError, TimeoutError) as exc:
        _drop(topic, exc)
        return False
    sent.add_done_callback(settled)
    return True


def _drop(topic: str, exc: BaseException) -> None:
    DROPPED[topic] += 1
    log.warning("could not publish to %s (%r); dropped (%d so far)", topic, exc, DROPPED[topic])


_QUIET = "relstream-outage-handler"
OUTAGE_LOGGERS = ("aiokafka", "relstream.kafka")  # the lines a broker outage repeats


def quiet_outages(period_s: float = 30.0) -> None:
    """Send the Kafka clients' warnings and errors (aiokafka's, relstream.kafka's) to
    stderr through one `RateLimited` filter: a broker outage then prints one line per kind
    and period with a count, not one per reconnect and poll, and aiokafka's outage lines
    as one relstream line (`InOurWords`). Idempotent."""
    quiet, in_our_words = RateLimited(period_s), InOurWords()
    for name in OUTAGE_LOGGERS:
        logger = logging.getLogger(name)
        if any(handler.get_name() == _QUIET for handler in logger.handlers):
            continue
        handler = logging.StreamHandler(sys.stderr)
        handler.set_name(_QUIET)
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
        handler.setLevel(logging.WARNING)
        handler.addFilter(in_our_words)  # first: then one kind for `quiet`
        handler.addFilter(quiet)
        logger.addHandler(handler)
        logger.propagate = False
