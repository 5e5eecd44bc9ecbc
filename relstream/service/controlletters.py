"""Engine process: a bad control message dead-lettered once (issue 48, item 9).

Every engine reads every control message, from the earliest kept, at every start: each
dead-lettered a bad one, once per engine and again on every start (3 letters for 1
message with two engines and a restart). Where the broker has transactions the letter and
the control partition's offset are committed in one transaction of a producer shared by
every engine of the group (transactional id `<group>.control.<topic>.<partition>`, its
offsets under the group `<group>.control`): an engine opens that producer, which fences
whichever other engine held it, reads the committed offset (final after the fencing),
and letters the message only if the offset is not past it. Of two engines at once, one
commits and the other is fenced or finds it committed; fenced, it looks again after a
backoff (the other may die before its commit); an engine started again finds it
committed. Without transactions (Tansu) each engine letters it, at least once, as before.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from aiokafka import TopicPartition

from relstream.kafka.delivery.letters import dead_letter_of, deliver_letter, send_dead_letter
from relstream.kafka.delivery.outputs import Transacted
from relstream.kafka.delivery.publish import Backoff
from relstream.kafka.delivery.transactions import PartitionProducers
from relstream.kafka.delivery.txfaults import Fenced

log = logging.getLogger("relstream.engine")


class ControlLetters:
    """Dead letters of control messages: once per message where `transactions`."""

    def __init__(self, config, producer, transactions: bool) -> None:
        self._config = config
        self._producer = producer  # the service's, for letters without transactions
        self._transactions = transactions

    async def letter(self, message, topic: str, reason: str, stalled) -> bool | None:
        """Dead-letter the control `message` to `topic`: True once the broker has it,
        False if it refused it for good, None where it was lettered already (by another
        engine, or before a restart)."""
        if not self._transactions:
            return await send_dead_letter(self._producer, topic, message, reason, stalled)
        backoff = Backoff()
        for tries in itertools.count(1):
            try:
                return await self._once(message, topic, reason, stalled)
            except Fenced:  # another engine took the id: letters it, or dies first
                await asyncio.sleep(backoff.after(tries))  # then its mark is read again
        raise AssertionError("unreachable")

    async def _once(self, message, topic: str, reason: str, stalled) -> bool | None:
        config = self._config
        partition = TopicPartition(message.topic, message.partition)
        producers = PartitionProducers(
            config.bootstrap, f"{config.group_id}.control", config.security, config.stall_s
        )
        try:
            await producers.open([partition])  # fences any other engine's: marks are final
            marks = await producers.committed([partition], lambda: {partition})
            mark = marks.get(partition)
            if mark is not None and mark.offset > message.offset:
                return None
            letter, what = dead_letter_of(message, reason)
            next_offset = (message.offset + 1, "")  # lost, the offset goes on without it

            async def deliver(parts) -> None:
                await Transacted(producers).deliver(partition, parts, lambda: next_offset, stalled)

            return await deliver_letter(topic, letter, what, deliver)
        finally:
            await producers.close_all()
