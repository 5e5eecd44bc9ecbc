"""Exactly once by the broker's transactions (issue 39, item 1): the engine commits a
relQuery's result and its offset in one transaction, fenced per input partition, so a
`read_committed` reader sees one result per relQuery through a rebalance; the offsets
it finished out of order ride in the commit's metadata.

The bookkeeping is checked on hand-computed cases and against a model (hypothesis); the
transactions on the default broker (noida-db), which has them."""

import asyncio
import collections
import contextlib
import itertools
import logging
import uuid

import pytest
from aiokafka import TopicPartition
from engines import engine_process, wait_for
from helpers import committed_offsets, read_all, relquery, wait_until, zombie_and_owner

from relstream.kafka.clients.aio import new_admin, new_producer, produce
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.publish import Backoff, Send
from relstream.kafka.delivery.transactions import PartitionProducers
from relstream.kafka.delivery.txfaults import Breaks, Fenced
from relstream.kafka.delivery.txprobe import has_transactions
from relstream.kafka.tools.brokers import DEFAULT_BROKER, EmbeddedBroker
from relstream.service.offsets import MAX_AHEAD, OffsetBook, decode_ahead, encode_ahead
from relstream.service.service import KafkaService, ServiceConfig
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.wire import ResultMessage, decode, encode
from relstream.wire.convert import relquery_message

# the bookkeeping


def test_a_commit_names_its_prefix_and_the_offsets_finished_above_it():
    book = OffsetBook()
    for offset in (10, 11, 12, 13):
        lease = book.start("p", offset)
    assert book.progress("p", 12) == (10, frozenset({12}))  # 10 and 11 still run
    book.finish("p", 12, lease)
    assert book.progress("p", 10) == (11, frozenset({12}))
    book.finish("p", 10, lease)
    assert book.committable() == {"p": 11}
    assert book.progress("p", 11) == (13, frozenset())  # 11 and 12 done: 13 is next
    book.finish("p", 11, lease)
    book.committable()
    assert book.progress("p", 13) == (14, frozenset())  # everything done: past the last


def test_work_of_an_ended_assignment_neither_finishes_nor_commits_in_the_next():
    # Issue 59, defect 2: the session expired and the same partition came back at once.
    # The old assignment's work on offset 5 finished after the new one re-read offset 5:
    # it committed with the new producer, and the new assignment answered 5 again. Work
    # now carries the lease it was read under, and only the current lease counts.
    from relstream.kafka.delivery.txfaults import Fenced
    from relstream.service.commits import ExactlyOnce

    book = OffsetBook()
    old = book.start("p", 5)
    book.forget(["p"])  # revoked
    new = book.start("p", 5)  # handed back, read again
    assert new != old and book.holds("p", new) and not book.holds("p", old)
    commits = ExactlyOnce(outputs=None, book=book)
    with pytest.raises(Fenced):
        commits._at("p", 5, old)  # its transaction aborts: nothing visible
    book.finish("p", 5, old)  # ignored: not the new assignment's answer
    assert book.committable() == {} and book.unfinished("p", 5, new)
    assert commits._at("p", 5, new) == (6, "")
    book.finish("p", 5, new)
    assert book.committable() == {"p": 6}


def test_a_prefix_steps_over_offsets_never_started():
    # Offset 21 is a transaction marker: no message, never started.
    book = OffsetBook()
    book.start("p", 20)
    book.start("p", 22)
    assert book.progress("p", 20) == (22, frozenset())


def test_finished_offsets_above_the_prefix_are_bounded():
    book = OffsetBook()
    for offset in range(MAX_AHEAD + 2):
        lease = book.start("p", offset)
    for offset in range(1, MAX_AHEAD):
        book.finish("p", offset, lease)  # MAX_AHEAD - 1 finished above offset 0
    assert book.may_finish("p", MAX_AHEAD)
    assert not book.may_finish("p", MAX_AHEAD, reserved=1)  # one more is on its way
    book.finish("p", MAX_AHEAD, lease)
    assert not book.may_finish("p", MAX_AHEAD + 1)
    assert book.may_finish("p", 0) and book.is_prefix("p", 0)  # the prefix always may


def test_the_offsets_above_a_prefix_survive_the_commit_metadata():
    assert encode_ahead({12, 13, 50}, 10) == "relstream-ahead:1:2,3,14"
    assert decode_ahead("relstream-ahead:1:2,3,14", 10) == {12, 13, 50}
    assert encode_ahead((), 10) == ""
    assert decode_ahead("", 10) == decode_ahead("someone else's", 10) == frozenset()
    spread = {1000 + d for d in range(36**3 - MAX_AHEAD, 36**3)}
    assert len(encode_ahead(spread, 1000)) < 1300  # under Kafka's 4096-byte default


@pytest.mark.parametrize("count", range(1, 7))
def test_any_finishing_order_commits_the_first_unfinished_and_the_rest(count):
    # Every order of finishing `count` offsets, against the definition.
    for order in itertools.permutations(range(count)):
        _check_finishing_order(order)


def _check_finishing_order(order) -> None:
    book, finished = OffsetBook(), set()
    for offset in range(len(order)):
        lease = book.start("p", offset)
    for offset in order:
        first, ahead = book.progress("p", offset)
        finished.add(offset)
        expected_first = min(set(range(len(order) + 1)) - finished)
        assert first == expected_first
        assert ahead == {o for o in finished if o > expected_first}
        assert decode_ahead(encode_ahead(ahead, first), first) == ahead
        book.finish("p", offset, lease)
        book.committable()


# the transactions, on the default broker

SLOW = ["--sim-speed", "0.2"]  # a simulated engine five times slower: work stays in flight


def fresh_topics() -> Topics:
    return Topics(prefix=f"x{uuid.uuid4().hex[:6]}.")


async def results_by_id(bootstrap: str, topic: str, isolation: str) -> collections.Counter:
    """How many results a reader of `isolation` sees for each relQuery id."""
    seen = await read_all(bootstrap, topic, isolation, 1.0)
    return collections.Counter(decode(ResultMessage, m.value).id for m in seen)


def test_a_new_owner_fences_the_old_one_and_its_commit_carries_the_metadata(default_broker):
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    partition = TopicPartition(topics.relqueries, 0)

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        assert await has_transactions(default_broker.bootstrap, group) == (True, "")
        fenced = []  # `old` still has the partition assigned: it must ask its group
        old = PartitionProducers(default_broker.bootstrap, group, on_fenced=fenced.append)
        new = PartitionProducers(default_broker.bootstrap, group)
        await old.open([partition])
        await old.transact(partition, [Send(topics.results, b"old-1", b"a", "a")], lambda: (1, ""))
        await new.open([partition])  # the partition's new owner
        with pytest.raises(Fenced):
            await old.transact(
                partition, [Send(topics.results, b"old-2", b"b", "b")], lambda: (2, "")
            )
        assert fenced == [partition]  # else the partition would stop here for good
        metadata = encode_ahead({4}, 2)
        await new.transact(
            partition, [Send(topics.results, b"new-2", b"b", "b")], lambda: (2, metadata)
        )
        admin = new_admin(default_broker.bootstrap)
        await admin.start()
        try:
            offsets = await admin.list_consumer_group_offsets(group, partitions=[partition])
        finally:
            await admin.close()
        await old.close_all()
        await new.close_all()
        committed = await read_all(default_broker.bootstrap, topics.results, "read_committed")
        return offsets[partition], [m.value for m in committed]

    mark, values = asyncio.run(scenario())
    assert sorted(values) == [b"new-2", b"old-1"]  # the fenced producer's message: never
    assert mark.offset == 2 and decode_ahead(mark.metadata, 2) == {4}


@pytest.mark.slow
def test_a_transaction_the_broker_restarted_under_is_redone_not_lost(tmp_path):
    # noida-db forgets, when it restarts, which partitions an open transaction wrote to:
    # committed after the restart, the transaction's offset commit counts and its message
    # stays invisible to `read_committed` readers for good (measured: commit returned,
    # offset 9 committed, 0 of 1 messages readable). Its producer saw its connection
    # break, so the transaction is redone from the start instead.
    topics, group = fresh_topics(), "restarted"
    partition = TopicPartition(topics.relqueries, 0)
    broker = EmbeddedBroker(DEFAULT_BROKER, data_dir=tmp_path / "broker")
    broker.start()
    restarts = []

    def offsets() -> tuple[int, str]:  # asked after the sends are acknowledged
        if not restarts:
            restarts.append(1)
            broker.stop()  # blocks the loop: the restart falls inside the
            broker.start()  # transaction, on the same port and data
        return (9, "")

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        producers = PartitionProducers(broker.bootstrap, group, stall_s=60.0)
        await producers.open([partition])
        await producers.transact(partition, [Send(topics.results, b"once", b"k", "m")], offsets)
        await producers.close_all()
        admin = new_admin(broker.bootstrap)
        await admin.start()
        try:
            marks = await admin.list_consumer_group_offsets(group, partitions=[partition])
        finally:
            await admin.close()
        seen = await read_all(broker.bootstrap, topics.results, "read_committed")
        return marks[partition].offset, [m.value for m in seen]

    try:
        assert asyncio.run(scenario()) == (9, [b"once"])
    finally:
        broker.stop()



def test_a_commit_sent_after_a_restart_goes_as_an_abort_never_half_committed(own_broker):
    # noida-db commits, after a restart, the offsets a transaction sent the new broker and
    # none of its messages (measured: offset 7 committed, 0 of 1 messages readable). A
    # commit sent once a connection broke goes as an abort (`txfaults.Breaks`): nothing
    # counts, and the writer finds out and redoes it; killed first, its successor does.
    group, partition = "cut", TopicPartition("in", 0)
    broker = own_broker

    async def scenario():
        await create_topics(broker.bootstrap, {"in": 1, "out": 1})
        producer = new_producer(broker.bootstrap, transactional_id="cut")
        breaks = Breaks(producer)
        await producer.start()
        try:
            await producer.begin_transaction()
            await (await producer.send("out", b"answer", partition=0))
            broker.stop()  # blocks the loop: the offsets and the commit
            broker.start()  # reach the restarted broker
            await producer.send_offsets_to_transaction({partition: (7, "")}, group)
            with breaks.commit_unbroken():
                await producer.commit_transaction()
        finally:
            await producer.stop()
        admin = new_admin(broker.bootstrap)
        await admin.start()
        try:
            marks = await admin.list_consumer_group_offsets(group)
        finally:
            await admin.close()
        seen = await read_all(broker.bootstrap, "out", "read_committed", idle_s=1.5)
        return breaks.turned, marks, [m.value for m in seen]

    assert asyncio.run(scenario()) == (True, {}, [])


@pytest.mark.slow
def test_a_zombie_fenced_before_a_restart_does_not_commit_the_owners_answer_twice(own_broker):
    # noida-db forgets, when it restarts, the epoch that fences a transactional id whose
    # transaction is open: the zombie's old producer committed after the restart, and its
    # marker (one producer id for every epoch of the id) also committed the owner's
    # pending batch: two results for one relQuery (the short crash drill, one run in
    # twelve). A producer whose connection broke is renewed before its next transaction
    # (a new producer id after a restart), and the owner's renewal aborts its batch.
    topics, group = fresh_topics(), "zombie"
    partition = TopicPartition(topics.relqueries, 0)
    broker = own_broker

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        answer = [Send(topics.results, b"answer", b"q", "the answer", partition=0)]
        retry = {"backoff": Backoff(0.1)}
        async with zombie_and_owner(broker.bootstrap, group, partition, retry, retry) as (
            zombie, owner, consumers,
        ):  # fmt: skip
            await zombie.take_over(consumers[0], [partition])
            await owner.take_over(consumers[1], [partition])  # fences the zombie
            producer = owner._producers[partition]
            send_offsets = producer.send_offsets_to_transaction

            async def restart_then_the_zombie(offsets, group_id):
                # The owner's transaction is open: the broker restarts, the owner's answer
                # is sent again into the transaction it forgot, and the zombie answers the
                # same relQuery.
                broker.stop()
                broker.start()
                await asyncio.sleep(2.0)  # both clients see their connections broken
                await (await producer.send(topics.results, b"answer", b"q", partition=0))
                with contextlib.suppress(Fenced):
                    await zombie.transact(partition, answer, lambda: (1, ""))
                return await send_offsets(offsets, group_id)

            producer.send_offsets_to_transaction = restart_then_the_zombie
            with contextlib.suppress(Fenced):
                await owner.transact(partition, answer, lambda: (1, ""))
        seen = await read_all(broker.bootstrap, topics.results, "read_committed")
        return [m.value for m in seen]

    assert asyncio.run(scenario()) == [b"answer"]


@pytest.mark.slow
def test_a_batch_sent_again_after_a_restart_does_not_hold_readers_back(tmp_path):
    # noida-db aborts open transactions when it restarts. A batch of the transaction sent
    # after the restart (aiokafka resends what the broken connection cut) is written in a
    # transaction the broker no longer knows wrote that partition: without the producer
    # naming the partition again before its abort (`txprobe._announce_again`), no marker
    # ever followed it and every later message of the partition stayed invisible to
    # `read_committed` readers (the short crash drill lost 30 relQueries so).
    topics, group = fresh_topics(), "resent"
    partition = TopicPartition(topics.relqueries, 0)
    broker = EmbeddedBroker(DEFAULT_BROKER, data_dir=tmp_path / "broker")
    broker.start()

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        producers = PartitionProducers(broker.bootstrap, group, stall_s=60.0)
        await producers.open([partition])
        first = producers._producers[partition]
        send = first.send

        async def restart_before_the_second(topic, value, key, to, headers):
            if value == b"second":  # blocks the loop: the restart falls between the two
                broker.stop()
                broker.start()
            future = await send(topic, value, key, to, headers=headers)
            if value == b"first":  # on the broker, its partition in the transaction
                await future
            return future

        first.send = restart_before_the_second
        sends = [Send(topics.results, value, b"k", value.decode(), partition=0)
                 for value in (b"first", b"second")]  # fmt: skip
        await producers.transact(partition, sends, lambda: (9, ""))
        await producers.transact(partition, [Send(topics.results, b"next", b"k", "n")],
                                 lambda: (10, ""))  # fmt: skip
        await producers.close_all()
        seen = await read_all(broker.bootstrap, topics.results, "read_committed")
        return [m.value for m in seen]

    try:
        # the redone transaction and the next one: nothing held back behind the resent batch
        assert asyncio.run(scenario()) == [b"first", b"second", b"next"]
    finally:
        broker.stop()


@pytest.mark.slow
def test_a_rebalance_mid_flight_leaves_one_committed_result_per_relquery(default_broker, caplog):
    # Engine A serves slowly (four relQueries in flight); B joins its group while A is
    # mid-flight, so partitions move with work running on them: A's is fenced, and a
    # read_committed reader sees each relQuery's result once. On 1d50ea0 (noida-db) the
    # join stalls the group: A's commit in its revocation callback is refused
    # (IllegalGeneration) and the rebalance did not complete, so not every relQuery was
    # answered within 120 s (twice out of twice).
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    sent = [relquery(i) for i in range(40)]
    caplog.set_level(logging.INFO, logger="relstream.engine")

    async def engine(stop: asyncio.Event) -> None:
        config = ServiceConfig(
            default_broker.bootstrap, topics, group, broker=default_broker.kind,
            max_backlog_rows=12,
        )  # fmt: skip
        backend = SimRelQueryBackend(SimSettings(time_scale=1.0, speed=0.2))
        await KafkaService(config, backend).run(stop)

    async def results(isolation: str) -> collections.Counter:
        return await results_by_id(default_broker.bootstrap, topics.results, isolation)

    async def scenario():
        await create_topics(default_broker.bootstrap, topics.layout())
        messages = [(rq.id.encode(), encode(relquery_message(rq))) for rq in sent]
        await produce(default_broker.bootstrap, topics.relqueries, messages)
        stop = asyncio.Event()
        first = asyncio.create_task(engine(stop))
        async with asyncio.timeout(120):
            while len(await results("read_committed")) < 4:  # A is answering
                await asyncio.sleep(0.2)
            second = asyncio.create_task(engine(stop))
            while len(await results("read_committed")) < len(sent):
                await asyncio.sleep(0.5)
        stop.set()
        await asyncio.gather(first, second)
        return await results("read_committed"), await results("read_uncommitted")

    committed, uncommitted = asyncio.run(scenario())
    assert set(committed) == {rq.id for rq in sent}
    assert set(committed.values()) == {1}, {i: n for i, n in committed.items() if n > 1}
    assert sum(uncommitted.values()) >= len(sent)
    assert "exactly once" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("rejoin", ["broker-restart", "instance-id"])
def test_an_engine_killed_with_results_ahead_of_its_prefix_is_taken_over_once(tmp_path, rejoin):
    # A large relQuery heads partition 0 and six small ones follow: the engine answers
    # the small ones first, so its committed offset cannot pass the large one. It is
    # SIGKILLed before the large one is done and started again with the same command:
    # noida-db keeps a SIGKILLed member in its group, so either the broker restarts or
    # the engine is a static member (its instance id) and takes its place back.
    # On 1d50ea0 it answers the six again from the committed offset: two results each.
    # With transactions their offsets ride in the commit's metadata and it skips them.
    broker = EmbeddedBroker(DEFAULT_BROKER, data_dir=tmp_path / "broker")
    broker.start()
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    large = relquery(0, size=60)
    small = [relquery(i, size=1) for i in range(1, 7)]
    log = tmp_path / "engines.log"
    slow = [*SLOW, "--instance-id", "e1"] if rejoin == "instance-id" else SLOW

    async def send() -> None:
        await create_topics(broker.bootstrap, topics.layout())
        messages = [(rq.id.encode(), encode(relquery_message(rq))) for rq in [large, *small]]
        await produce(broker.bootstrap, topics.relqueries, messages, partitioner=lambda *a: 0)

    def committed() -> collections.Counter:
        return asyncio.run(results_by_id(broker.bootstrap, topics.results, "read_committed"))

    engines = []
    try:
        asyncio.run(send())
        engines.append(engine_process(broker, topics, group, log, budget_rows=200, extra=slow))
        assert wait_for(lambda: len(committed()) >= 4, 90), log.read_text()
        engines[0].kill()
        engines[0].wait()
        seen_before = committed()
        assert large.id not in seen_before, "the large relQuery finished before the kill"
        if rejoin == "broker-restart":
            broker.stop()
            broker.start()
        engines.append(engine_process(broker, topics, group, log, budget_rows=200, extra=slow))
        assert wait_for(lambda: len(committed()) == 7, 120), log.read_text()
        # Done with all seven: the group's offset past them, in the transaction (or after
        # the transactions) that hold whatever it answered, twice or not.
        wait_until(
            lambda: committed_offsets(broker.bootstrap, group, topics.relqueries).get(0) == 7,
            60,
            "the group's commit past all seven",
        )
        final = committed()
        uncommitted = asyncio.run(
            results_by_id(broker.bootstrap, topics.results, "read_uncommitted")
        )
    finally:
        for engine in engines:
            engine.kill()
            engine.wait()
        broker.stop()
    assert set(final) == {rq.id for rq in [large, *small]}
    assert set(final.values()) == {1}, final
    assert "answered by its previous owner" in log.read_text()
    assert sum(uncommitted.values()) >= 7


def test_without_transactions_the_engine_says_so_once_and_answers(caplog):
    # Tansu refuses InitProducerId: one line at start, then at least once as before.
    broker = EmbeddedBroker("tansu")
    broker.start()
    topics, group = fresh_topics(), f"g{uuid.uuid4().hex[:6]}"
    sent = [relquery(i) for i in range(3)]
    caplog.set_level(logging.INFO, logger="relstream.engine")

    async def scenario() -> collections.Counter:
        await create_topics(broker.bootstrap, topics.layout())
        messages = [(rq.id.encode(), encode(relquery_message(rq))) for rq in sent]
        await produce(broker.bootstrap, topics.relqueries, messages)
        config = ServiceConfig(broker.bootstrap, topics, group, broker=broker.kind)
        stop = asyncio.Event()
        task = asyncio.create_task(KafkaService(config, SimRelQueryBackend()).run(stop))
        async with asyncio.timeout(60):
            while (
                len(seen := await results_by_id(broker.bootstrap, topics.results, "read_committed"))
                < 3
            ):
                await asyncio.sleep(0.5)
        stop.set()
        await task
        return seen

    try:
        seen = asyncio.run(scenario())
    finally:
        broker.stop()
    assert set(seen) == {rq.id for rq in sent}
    assert caplog.text.count("the broker has no transactions") == 1
    assert "exactly once" not in caplog.text
