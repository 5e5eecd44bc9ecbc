"""What can go wrong in a transaction, told apart (`kafka/delivery/transactions.py` acts on it):
fencing (the partition is another owner's), a refusal of one message for good, the
producer's own state, a connection that broke before the commit, a commit whose answer
was lost.
"""

from __future__ import annotations

import contextlib

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
from aiokafka.producer.sender import EndTxnHandler
from aiokafka.protocol.transaction import EndTxnRequest

from relstream.kafka.delivery.outcome import Written
from relstream.kafka.delivery.publish import Refused, Send, unavailable


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


class Breaks:
    """How many of a producer's broker connections have broken so far (not idle or closed
    by us): a broker restart breaks them all. aiokafka has no public hook; its client
    calls `_on_connection_closed` for each closed connection.

    It also keeps the producer's commit to unbroken connections (`commit_unbroken`): a
    producer that saw a break is renewed before its next transaction
    (`PartitionProducers._once`), so any break is one since its transaction began.
    aiokafka sends a commit again on a new connection when one breaks under it; reaching
    noida-db after a restart, which forgot the transaction's partitions, that commit
    counts the offsets and the messages never show (issue 48: a writer killed before it
    found that out and sent them again lost rows or a relQuery's answer). Once a
    connection broke, the request goes as an abort instead (`turned`), and the caller
    finds out what landed."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.count = 0
        self._armed = False  # within `commit_unbroken`
        self.turned = False  # its commit was sent as an abort
        client = producer.client
        closed = client._on_connection_closed

        def on_closed(conn, reason) -> None:
            if reason not in (CloseReason.IDLE_DROP, CloseReason.SHUTDOWN):
                self.count += 1
            closed(conn, reason)

        client._on_connection_closed = on_closed
        producer._sender._relstream_breaks = self  # read by `_commit_or_abort`

    def __call__(self) -> int:
        return self.count

    @contextlib.contextmanager
    def commit_unbroken(self):
        """Within: a commit request made once a connection broke is an abort."""
        self._armed, self.turned = True, False
        try:
            yield
        finally:
            self._armed = False

    def broken(self) -> bool:
        return self._armed and self.count > 0


def _commit_or_abort(handler) -> EndTxnRequest:
    """aiokafka's EndTxn request, made at each try: an abort where the producer's
    `Breaks` says a connection broke since its transaction began."""
    request = _make_end_txn(handler)
    breaks = getattr(handler._sender, "_relstream_breaks", None)
    if not handler._commit_result or breaks is None or not breaks.broken():
        return request
    breaks.turned = True
    txn = handler._sender._txn_manager
    return EndTxnRequest(txn.transactional_id, txn.producer_id, txn.producer_epoch, False)


_make_end_txn = EndTxnHandler.create_request
EndTxnHandler.create_request = _commit_or_abort


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
