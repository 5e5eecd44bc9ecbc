"""What can go wrong in a transaction, told apart (`kafka/transactions.py` acts on it):
fencing (the partition is another owner's), a refusal of one message for good, the
producer's own state, a connection that broke before the commit, a commit whose answer
was lost.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from aiokafka import AIOKafkaProducer
from aiokafka.conn import CloseReason
from aiokafka.errors import (
    ConcurrentTransactions,
    DuplicateSequenceNumber,
    IllegalStateError,
    InvalidProducerEpoch,
    InvalidProducerIdMapping,
    InvalidTxnState,
    KafkaError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    UnknownProducerId,
)

from relstream.kafka.delivery import Refused, Send, unavailable
from relstream.kafka.outcome import Written


class BrokerLost(Exception):
    """The producer's connection broke during a transaction, before its commit: the
    broker may have restarted and forgotten the transaction's partitions, so it is
    redone."""


class Unanswered(Exception):
    """The commit was sent and its answer lost: its outcome is to be found out."""

    def __init__(
        self, why: str, mark: tuple[int, str], written: list[Written], answered: bool = False
    ) -> None:
        super().__init__(why)
        self.mark = mark
        self.written = written
        self.answered = answered  # the commit returned: only its messages are in doubt


def count_breaks(producer: AIOKafkaProducer) -> Callable[[], int]:
    """How many of `producer`'s broker connections have broken so far (not idle or
    closed by us): a broker restart breaks them all. aiokafka has no public hook; its
    client calls `_on_connection_closed` for each closed connection."""
    client = producer.client
    closed = client._on_connection_closed
    breaks = 0

    def on_closed(conn, reason) -> None:
        nonlocal breaks
        if reason not in (CloseReason.IDLE_DROP, CloseReason.SHUTDOWN):
            breaks += 1
        closed(conn, reason)

    client._on_connection_closed = on_closed
    return lambda: breaks


class Fenced(Exception):
    """The partition is no longer this process's: a new owner's producer fenced ours, or
    it was revoked while its transaction waited. Its work is the new owner's."""


# The producer's own state gone wrong, not the message: a new producer under the id
# (`_renew`) starts its sequences and epoch anew, and the transaction is tried again.
PRODUCER_STATE = (
    OutOfOrderSequenceNumber, UnknownProducerId, InvalidTxnState, InvalidProducerEpoch,
    InvalidProducerIdMapping, ConcurrentTransactions, DuplicateSequenceNumber,
    IllegalStateError,
)  # fmt: skip


@contextlib.contextmanager
def refusal(send: Send):
    """A Kafka error for `send` that is neither fencing, nor an outage, nor the producer's
    own state, as `Refused`: only then is the message at fault."""
    try:
        yield
    except KafkaError as exc:
        if isinstance(exc, (ProducerFenced, *PRODUCER_STATE)) or unavailable(exc):
            raise
        raise Refused(f"the broker refused {send.what}: {exc!r}", send.what) from exc
