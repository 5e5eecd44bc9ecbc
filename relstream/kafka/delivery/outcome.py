"""A transaction whose commit went unanswered, or during which the producer's connection
broke: did it land? Found out from the broker's own record, never guessed (issue 48).

Two records say it. The group's committed mark (offset and metadata) for the input
partition is the one the transaction sent with `send_offsets_to_transaction`, or it is
not: another mark means the commit did not land, and the transaction is redone whole (a
new producer under its id aborts what it left open). Our mark means it landed; the
messages it wrote are then looked up as a `read_committed` reader sees them, once each
partition's last stable offset has passed them. One missing there was lost with the
transaction's partitions: noida-db, the default broker, forgets them when it restarts
mid-transaction, so the offsets count and the messages never show. Only those are sent
again. So an acknowledged commit whose answer was lost is never redone (a duplicate for
every `read_committed` reader), and one the broker half-forgot is completed, on every
broker alike.

The broker is asked until it answers, with the caller's backoff, for as long as the
partition is the caller's (`still_ours`): a new owner's producer settles the
transaction its own way (it fences ours, aborts what is open and reads the committed
offset).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import TopicPartition

from relstream.kafka.clients.aio import new_admin, new_consumer
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.delivery.publish import Backoff, Send

log = logging.getLogger("relstream.kafka.delivery.transactions")

READ_S = 10.0  # the longest one look at the committed messages may take


@dataclass(frozen=True)
class Written:
    """A message the transaction wrote, where the broker acknowledged it."""

    send: Send
    partition: TopicPartition
    offset: int


@dataclass(frozen=True)
class Outcome:
    """What became of a transaction whose commit went unanswered."""

    landed: bool  # the broker holds its offset commit
    missing: tuple[Send, ...] = ()  # of a landed commit, messages no reader will see


class Gone(Exception):
    """The partition stopped being the caller's while its outcome was looked up."""


async def find_outcome(
    bootstrap: str,
    group: str,
    partition: TopicPartition,
    mark: tuple[int, str],
    written: list[Written],
    still_ours: Callable[[], bool],
    security: KafkaSecurity = PLAINTEXT,
    backoff: Backoff | None = None,
    answered: bool = False,
) -> Outcome:
    """Whether the transaction committing `partition` at `mark` landed, and which of its
    `written` messages are missing if it did (`answered`: the commit returned, so it
    landed: only the messages are looked up). Raises `Gone` once not `still_ours()`, or
    where the group's offset is past `mark`: another owner committed since."""
    backoff = backoff or Backoff()
    tries = 0
    while True:
        if not still_ours():
            raise Gone(f"{partition} was revoked while its commit's outcome was looked up")
        tries += 1
        try:
            committed = (
                None if answered else await _committed_mark(bootstrap, security, group, partition)
            )
            if committed is not None and committed[0] > mark[0]:  # a zombie's try
                raise Gone(f"{partition} was committed past {mark[0]} by another owner")
            if not answered and committed != mark:
                log.info(
                    "%s: the unanswered commit at %d did not land (the group holds %s): "
                    "redone", partition, mark[0], committed,
                )  # fmt: skip
                return Outcome(landed=False)
            visible = await _visible(bootstrap, security, written)
            missing = tuple(w.send for w in written if (w.partition, w.offset) not in visible)
            log.info(
                "%s: the unanswered commit at %d landed; %d of its %d messages %s",
                partition, mark[0], len(missing), len(written),
                "are sent again (the broker lost them)" if missing else "missing",
            )  # fmt: skip
            return Outcome(landed=True, missing=missing)
        except (Gone, asyncio.CancelledError):
            raise
        except Exception as exc:  # the broker did not answer, or held them back: again
            wait = backoff.after(tries)
            log.warning(
                "%s: the outcome of an unanswered commit is not known yet (%s); asked "
                "again in %.1f s", partition, exc, wait,
            )  # fmt: skip
            await asyncio.sleep(wait)


async def group_marks(bootstrap: str, security: KafkaSecurity, group: str, partitions) -> dict:
    """The group's committed offsets and metadata of `partitions`, asked once by an admin
    client of its own (the take-over's read and the outcome's are the same)."""
    admin = new_admin(bootstrap, security)
    try:
        await admin.start()
        return await admin.list_consumer_group_offsets(group, partitions=list(partitions))
    finally:
        await admin.close()


async def mark_moved(
    bootstrap: str, security: KafkaSecurity, group: str, partition: TopicPartition, known
) -> bool:
    """Whether the group's mark of `partition` differs from `known` ((offset, metadata),
    or None for no commit)."""
    return await _committed_mark(bootstrap, security, group, partition) != known


async def _committed_mark(
    bootstrap: str, security: KafkaSecurity, group: str, partition: TopicPartition
) -> tuple[int, str] | None:
    mark = (await group_marks(bootstrap, security, group, [partition])).get(partition)
    if mark is None or mark.offset < 0:
        return None
    return mark.offset, mark.metadata or ""


async def _visible(
    bootstrap: str, security: KafkaSecurity, written: list[Written]
) -> set[tuple[TopicPartition, int]]:
    """Which of `written` a `read_committed` reader sees: each partition is read from the
    first of them once its last stable offset has passed the last (until then the
    transaction's markers are on their way). Raises TimeoutError past `READ_S`."""
    if not written:
        return set()
    first: dict[TopicPartition, int] = {}
    last: dict[TopicPartition, int] = {}
    for w in written:
        first[w.partition] = min(first.get(w.partition, w.offset), w.offset)
        last[w.partition] = max(last.get(w.partition, w.offset), w.offset)
    consumer = new_consumer(bootstrap, security=security, isolation_level="read_committed")
    seen: set[tuple[TopicPartition, int]] = set()
    stable: dict = {}
    try:
        await consumer.start()
        consumer.assign(list(first))
        try:
            async with asyncio.timeout(READ_S):
                while True:  # the markers of a commit the broker took are written after it
                    stable = await consumer.end_offsets(list(first))
                    if all(stable[tp] > last[tp] for tp in first):
                        break
                    await asyncio.sleep(0.1)
        except TimeoutError:
            held = {f"{tp.topic}[{tp.partition}]@{stable.get(tp)}" for tp in first}
            raise TimeoutError(
                f"held back by an open transaction (last stable offsets {sorted(held)}): "
                "a writer's that died mid-transaction?"
            ) from None
        async with asyncio.timeout(READ_S):
            for tp, offset in first.items():
                consumer.seek(tp, offset)
            left = set(first)
            while left:
                batches = await consumer.getmany(*left, timeout_ms=500)
                for tp, records in batches.items():
                    seen.update((tp, record.offset) for record in records)
                for tp in list(left):
                    if await consumer.position(tp) > last[tp]:
                        left.discard(tp)
    finally:
        await consumer.stop()
    return seen
