"""A group member that the broker answers with no assignment bytes joins again.

noida-db sent one engine an empty SyncGroup assignment in a crash drill (seed 4: a static
member restarted, another left); aiokafka's coordination task died on it and the engine
ended. The broker's race cannot be provoked at will, so its answer is handed to a real
consumer of a real group on the default broker, through the coordinator's own join
callback, as its rebalance would hand it."""

from __future__ import annotations

import asyncio
import time
import uuid

from relstream.kafka.clients.aio import new_consumer, produce
from relstream.kafka.clients.creation import create_topics

PARTITIONS = 2


async def assigned_within(consumer, count: int, seconds: float) -> bool:
    """Whether the consumer holds `count` partitions within `seconds`, polling as a
    member does (its fetches keep it in the group)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await consumer.getmany(timeout_ms=200)
        if len(consumer.assignment()) == count:
            return True
    return False


def test_a_member_sent_no_assignment_joins_again_and_reads(default_broker):
    topic = f"join{uuid.uuid4().hex[:6]}"
    bootstrap = default_broker.bootstrap

    async def scenario():
        await create_topics(bootstrap, {topic: PARTITIONS})
        consumer = new_consumer(
            bootstrap, topic, broker_kind=default_broker.kind,
            group_id=f"g{topic}", group_instance_id=f"i{topic}",
        )  # fmt: skip
        await consumer.start()
        try:
            assert await assigned_within(consumer, PARTITIONS, 30)
            coordinator = consumer._coordinator
            protocol = coordinator._assignors[0].name
            # The broker's answer: no bytes where the leader's assignment belongs.
            await coordinator._on_join_complete(
                coordinator.generation, coordinator.member_id, protocol, b""
            )
            assert consumer.assignment() == set()  # nothing taken on an empty answer
            assert await assigned_within(consumer, PARTITIONS, 30)  # the next generation
            await produce(bootstrap, topic, [(b"k", b"after")])
            seen = []
            deadline = time.monotonic() + 30
            while not seen and time.monotonic() < deadline:
                batches = await consumer.getmany(timeout_ms=500)
                seen += [r.value for records in batches.values() for r in records]
            assert seen == [b"after"]
        finally:
            await consumer.stop()

    asyncio.run(scenario())
