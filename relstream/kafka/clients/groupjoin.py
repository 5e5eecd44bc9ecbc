"""A group member that the broker answers with no assignment joins again instead of dying.

The SyncGroup answer carries each member's assignment as bytes that the group's leader
wrote; a leader writes a version and a topic list for every member, an empty list
included. noida-db answered one member with no bytes at all, in the rebalance after a
static member's restart and another member's leave (the crash drill, seed 4). aiokafka
cannot decode that: its coordination task ends, every later fetch raises, and the
engine ended with a traceback while the drill still ran. Here such a member takes no
partitions and, after the consumer's retry backoff, asks for another rebalance, in which
the leader assigns it.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.consumer.group_coordinator import GroupCoordinator
from aiokafka.coordinator.protocol import ConsumerProtocol

log = logging.getLogger("relstream.kafka")

NO_PARTITIONS = ConsumerProtocol.ASSIGNMENT(0, [], b"").encode()


def rejoin_on_empty_assignment() -> None:
    """Make every aiokafka group consumer of this process join again on an empty
    assignment (once; a second call changes nothing)."""
    complete = GroupCoordinator._on_join_complete
    if getattr(complete, "rejoins_on_empty", False):
        return

    async def on_join_complete(self, generation, member_id, protocol, member_assignment_bytes):
        if member_assignment_bytes:
            await complete(self, generation, member_id, protocol, member_assignment_bytes)
            return
        log.warning(
            "group %s: the broker sent member %s no assignment (generation %s); "
            "joining again", self.group_id, member_id, generation,
        )  # fmt: skip
        await complete(self, generation, member_id, protocol, NO_PARTITIONS)
        await asyncio.sleep(self._retry_backoff_ms / 1000)
        self.request_rejoin()

    on_join_complete.rejoins_on_empty = True
    GroupCoordinator._on_join_complete = on_join_complete
