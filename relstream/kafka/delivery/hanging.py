"""Transactions no coordinator will ever end, found and aborted: the embedded noida-db's
stand-in for the transaction timeout with which Kafka ends them.

noida-db forgets open transactions when it restarts. A batch a writer sends in the
seconds after the restart (aiokafka resends what the broken connection cut) lands in a
transaction the broker no longer knows. A live writer ends it (`txprobe._announce_again`);
a writer SIGKILLed before it can leaves it open for good: its successor gets a new
producer id, so its fencing aborts nothing, and noida-db never times a transaction out.
Every `read_committed` reader of the partition then waits at that batch (the worker's
case stalls every relQuery partition), until the broker restarts again.

A partition is hanging when its last stable offset stands at one offset in two looks
`ROUND_S` apart and, asked then, the broker lists (ListTransactions) the producer of the
batch there in no open transaction, the offset read again after its answer: that batch
was open throughout, so a coordinator that knew it would have listed it. Such a batch is
aborted under its own producer id and epoch (AddPartitionsToTxn, then EndTxn, under a
transactional id of its own), which writes the ABORT marker Kafka's coordinator writes
for a transaction past its timeout; its writer was gone, and its successor redoes the
work (its input offsets were not committed). An idle broker is only read: noida-db
rewrites its whole store on ListTransactions, so it is asked only about a held
partition. A producer the broker lists is left alone: its writer, or the next owner's
fencing, ends it. Nothing is guessed: a broker that cannot list transactions, or a batch
that is not an open transactional one, is left as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass

from aiokafka import AIOKafkaClient, TopicPartition
from aiokafka.errors import for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.offset import OffsetRequest
from aiokafka.protocol.transaction import AddPartitionsToTxnRequest, EndTxnRequest
from aiokafka.protocol.types import (
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Int64,
    Schema,
    TaggedFields,
)
from aiokafka.record.memory_records import MemoryRecords

from relstream.kafka.clients.aio import new_client

log = logging.getLogger("relstream.kafka")

ROUND_S = 5.0  # between two looks at the partitions' last stable offsets
FIRST_BATCH_BYTES = 64 * 1024  # fetched at a held offset: its batch header is what counts
READ_COMMITTED, READ_UNCOMMITTED = 1, 0
ENDED = {"Empty", "CompleteCommit", "CompleteAbort", "Dead"}  # a listed state not open


class ListTransactionsResponse_v0(Response):
    API_KEY = 66
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("unknown_state_filters", CompactArray(CompactString("utf-8"))),
        (
            "transaction_states",
            CompactArray(
                ("transactional_id", CompactString("utf-8")),
                ("producer_id", Int64),
                ("transaction_state", CompactString("utf-8")),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class ListTransactionsRequest_v0(RequestStruct):
    FLEXIBLE_VERSION = True
    API_KEY = 66
    API_VERSION = 0
    RESPONSE_TYPE = ListTransactionsResponse_v0
    SCHEMA = Schema(
        ("state_filters", CompactArray(CompactString("utf-8"))),
        ("producer_id_filters", CompactArray(Int64)),
        ("tags", TaggedFields),
    )


class ListTransactionsRequest(Request[ListTransactionsRequest_v0]):
    """Every transaction the broker's coordinator knows, with its producer id and state
    (aiokafka has no such request; Kafka's admin tools list hanging ones with it)."""

    API_KEY = 66

    def build(self, request_struct_class: type[ListTransactionsRequest_v0]):
        return request_struct_class([], [], {})


@dataclass(frozen=True)
class Hanging:
    """A producer's open batch at a partition's last stable offset, no coordinator's."""

    partition: TopicPartition
    offset: int
    producer_id: int
    producer_epoch: int


class HangingTransactions:
    """Looks every `ROUND_S` for hanging transactions on one broker and aborts them (a
    round is `look`); `start` runs the rounds on a thread of their own."""

    def __init__(self, bootstrap: str, round_s: float = ROUND_S) -> None:
        self._bootstrap = bootstrap
        self._round_s = round_s
        self._held: dict[TopicPartition, int] = {}  # last look: partition -> its stable end
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.aborted: list[Hanging] = []  # what it ended, oldest first (a few, ever)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hanging-transactions", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        asyncio.run(self._rounds())

    async def _rounds(self) -> None:
        client = new_client(self._bootstrap, request_timeout_ms=10_000)
        host, port = self._bootstrap.rsplit(":", 1)
        try:
            while not self._stop.is_set():
                try:
                    # a plain connect first: aiokafka logs every refused connection
                    socket.create_connection((host, int(port)), timeout=1).close()
                    await self.look(client)
                except Exception as exc:  # a broker restarting, or down: next round
                    log.debug("looking for hanging transactions failed: %r", exc)
                    self._held.clear()  # two looks must bracket one listing
                await asyncio.to_thread(self._stop.wait, self._round_s)
        finally:
            with contextlib.suppress(Exception):
                await client.close()

    async def look(self, client: AIOKafkaClient) -> list[Hanging]:
        """One round: the hanging transactions found since the last look, aborted. The
        broker is asked for its transactions only when a partition is held across two
        looks (noida-db rewrites its whole store on ListTransactions), and the held
        offsets are read again after its answer, so the listing falls between two reads
        that saw the same batch open."""
        if not client.cluster.brokers():
            await client.bootstrap()
        await client.force_metadata_update()
        node = next(iter(client.cluster.brokers())).nodeId
        parts = [
            TopicPartition(topic, p)
            for topic in client.cluster.topics()
            if not topic.startswith("__")
            for p in client.cluster.partitions_for_topic(topic) or ()
        ]
        stable = await _ends(client, node, parts, READ_COMMITTED)
        ends = await _ends(client, node, parts, READ_UNCOMMITTED)
        held = {p: at for p, at in stable.items() if at < ends.get(p, at)}
        again = {p: at for p, at in held.items() if self._held.get(p) == at}
        self._held = held
        if not again:
            return []
        listed = await client.send(node, ListTransactionsRequest())
        if listed.error_code != 0:  # a broker that cannot list them: nothing is guessed
            return []
        open_producers = {
            producer for _, producer, state, _ in listed.transaction_states if state not in ENDED
        }  # fmt: skip
        still = await _ends(client, node, list(again), READ_COMMITTED)
        found = []
        for partition, offset in sorted(again.items()):
            if still.get(partition) != offset:
                continue  # ended meanwhile
            batch = await _first_batch(client, node, partition, offset)
            if batch is not None and batch[0] not in open_producers:
                found.append(Hanging(partition, offset, *batch))
        for hanging in await _abort(client, node, found):
            self.aborted.append(hanging)
            self._held.pop(hanging.partition, None)
        return found


async def _ends(client, node: int, parts: list[TopicPartition], isolation: int) -> dict:
    """Each partition's end for a reader of `isolation`: its last stable offset for a
    `read_committed` one."""
    by_topic: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for partition in parts:
        by_topic[partition.topic].append((partition.partition, -1))  # -1: the latest
    if not by_topic:
        return {}
    response = await client.send(node, OffsetRequest(-1, isolation, list(by_topic.items())))
    found = {}
    for topic, answers in response.topics:
        for partition, error_code, *info in answers:
            if error_code == 0 and len(info) >= 2:
                found[TopicPartition(topic, partition)] = info[1]
    return found


async def _first_batch(client, node: int, partition: TopicPartition, offset: int):
    """(producer id, epoch) of the open transactional batch at `offset`; None if what is
    there is anything else."""
    request = FetchRequest(
        0, 1, FIRST_BATCH_BYTES, READ_UNCOMMITTED,
        [(partition.topic, [(partition.partition, offset, FIRST_BATCH_BYTES)])],
    )  # fmt: skip
    response = await client.send(node, request)
    for _, answers in response.topics:
        for _, error_code, _, *data in answers:
            if error_code != 0:
                return None
            records = MemoryRecords(data[-1])
            if not records.has_next():
                return None
            batch = records.next_batch()
            open_batch = batch.is_transactional and not batch.is_control_batch
            if open_batch and batch.base_offset <= offset < batch.next_offset:
                return batch.producer_id, batch.producer_epoch
    return None


async def _abort(client, node: int, found: list[Hanging]) -> list[Hanging]:
    """Abort each producer's hanging batches under its own id and epoch: AddPartitionsToTxn
    names their partitions, EndTxn writes the ABORT markers there."""
    by_producer: dict[tuple[int, int], list[Hanging]] = defaultdict(list)
    for hanging in found:
        by_producer[hanging.producer_id, hanging.producer_epoch].append(hanging)
    ended = []
    for (producer, epoch), held in by_producer.items():
        txn = f"relstream.hanging.{producer}.{epoch}"
        topics: dict[str, list[int]] = defaultdict(list)
        for hanging in held:
            topics[hanging.partition.topic].append(hanging.partition.partition)
        added = await client.send(
            node, AddPartitionsToTxnRequest(txn, producer, epoch, list(topics.items()))
        )
        error = next((e for _, errors in added.errors for _, e in errors if e != 0), 0)
        if not error:
            done = await client.send(node, EndTxnRequest(txn, producer, epoch, False))
            error = done.error_code
        if error:
            log.warning("could not abort producer %d's hanging transaction: %s", producer,
                        for_code(error).__name__)  # fmt: skip
            continue
        for hanging in held:
            log.warning(
                "aborted a transaction no coordinator knows of (producer %d, epoch %d) that "
                "held %s[%d] at offset %d: its writer died after a broker restart, and "
                "read_committed readers waited there", producer, epoch,
                hanging.partition.topic, hanging.partition.partition, hanging.offset,
            )  # fmt: skip
        ended.extend(held)
    return ended
