"""Whether the broker has transactions, asked once at start; and how a transactional
producer is closed whatever its transaction's state.

Only the broker's refusal of `InitProducerId` (Tansu answers `UnknownError`) says it has
none, and the caller then runs at least once. A broker that cannot be reached, or does
not answer, says nothing: the caller waits, and says so every `PROBE_S`, rather than
run at least once inside a group whose other members commit exactly once (issue 48,
item 7: a slow broker at start-up made a process at least once for life, silently).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from relstream.kafka.clients.aio import new_producer
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.delivery.publish import unavailable

log = logging.getLogger("relstream.kafka.delivery.transactions")

PROBE_S = 30.0  # how long one probe waits for the broker's answer, and between log lines
STOP_S = 5.0  # how long a producer given up on may take to close
RETRY_S = 1.0  # between probes the broker did not answer


async def stop_producer(producer: AIOKafkaProducer) -> None:
    """Close a producer, whatever state its transaction is in (a fenced one re-raises its
    fencing on stop; one cut off by an outage would flush for its whole timeout). An open
    transaction (its task cancelled at shutdown) is aborted first: left open, it would
    hold back `read_committed` readers of its partitions until it timed out. The abort
    names every partition the transaction wrote again (`_announce_again`)."""
    with contextlib.suppress(Exception):  # not in a transaction: nothing to abort
        async with asyncio.timeout(STOP_S):
            _announce_again(producer)
            await producer.abort_transaction()
    with contextlib.suppress(Exception):
        async with asyncio.timeout(STOP_S):
            await producer.stop()


def _announce_again(producer: AIOKafkaProducer) -> None:
    """Have the producer add its open transaction's partitions to it again before it ends
    it. noida-db, the default broker, aborts open transactions when it restarts; a batch
    the producer sent again after the restart (aiokafka retries a produce cut by the
    broken connection) is then written inside a transaction the broker no longer knows
    wrote that partition. Neither this producer's abort nor a later owner's fencing puts
    a marker after it: the partition's last stable offset stays there, and every
    `read_committed` reader of the partition waits, until the broker restarts again
    (reproduced in the crash drill and in tests/kafka/test_exactly_once.py). Added again,
    the partitions get the abort's markers. On a broker that remembers them (Apache
    Kafka) adding a partition twice changes nothing. aiokafka has no public call for
    this: its transaction manager adds the partitions it holds as pending before the
    abort (`Sender._maybe_do_transactional_request`)."""
    txn = producer._txn_manager
    if txn is None or not txn.is_in_transaction():
        return
    txn._pending_txn_partitions |= txn._txn_partitions
    txn._txn_partitions.clear()


async def has_transactions(
    bootstrap: str, group: str, security: KafkaSecurity = PLAINTEXT, probe_s: float = PROBE_S
) -> tuple[bool, str]:
    """Whether the broker gives producers transactional ids, and if not why: a producer
    with the id `{group}.probe` is started and stopped. Asked until the broker answers
    (each try waits `probe_s`; a line is logged after each unanswered one): only a
    refusal says it has none."""
    said = None  # when the last warning was logged
    while True:
        producer = new_producer(bootstrap, security, transactional_id=f"{group}.probe")
        try:
            async with asyncio.timeout(probe_s):
                await producer.start()
            return True, ""
        except TimeoutError:
            why = f"no answer to InitProducerId within {probe_s:g} s"
        except KafkaError as exc:
            if not unavailable(exc):
                return False, f"InitProducerId refused: {exc!r}"
            why = repr(exc)
        finally:
            await stop_producer(producer)
        now = asyncio.get_running_loop().time()
        if said is None or now - said >= probe_s:
            said = now
            log.warning(
                "cannot tell yet whether the broker at %s has transactions (%s): waiting "
                "for its answer before serving, rather than run at least once in a group "
                "that may commit exactly once", bootstrap, why,
            )  # fmt: skip
        await asyncio.sleep(RETRY_S)
