"""The window stage's commits, through the one delivery layer (`kafka.delivery.outputs`).

Per input rows partition, each step delivers what it settled there: the relQueries of the
windows it closed and the dead letters of the rejected rows its commit passes, with the
offset commit (the start of the window still open).

- Exactly once (`Transacted`, the broker has transactions): all of it in one transaction.
  A worker killed mid-step leaves an open transaction that its replacement's producer
  (same transactional id, `{group}.{topic}.{partition}`) aborts while fencing it, so
  `read_committed` readers never see its windows; the replacement resumes from the
  committed offset and cuts the same windows under the same ids. Nothing past the commit
  is ever visible, so no book of published windows is kept.
- At least once (`Acked`): each relQuery and letter sent until the broker has it, then
  the stage's consumer commits; the stage keeps the windows published and not yet
  committed past, so a replay cuts them the same and does not send them again (`stage`).

A rejected row at or past the commit point (inside the still-open window) would be read
again after a crash, so in either mode its dead letter is held until a commit passes it
and then goes with that commit. The held letters are those of the rows rejected while one
window is open: the open window closes by rows, bytes or `window_seconds` + lateness, so
they are the rejected rows of at most that span, each letter's original cut to
`DEAD_LETTER_ORIGINAL_BYTES`. A message the broker refuses for good is replaced
(`kafka.delivery.letters`): a relQuery by its rows' dead letters; nothing stops the partition.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition

from relstream.kafka.clients.aio import DEAD_LETTER_ORIGINAL_BYTES
from relstream.kafka.delivery.letters import Part, dead_letter_of, letter_part
from relstream.kafka.delivery.outputs import Outputs
from relstream.kafka.delivery.txfaults import Fenced
from relstream.stream.windowing import Window
from relstream.wire import encode
from relstream.wire.convert import dead_letter_message

log = logging.getLogger("relstream.worker")


def row_letters(window: Window, rows_topic: str, topic: str, reason: str) -> list[Part]:
    """A dead letter to `topic` for each row of a window whose relQuery the broker refused
    for good, naming the row; its original is the row as decoded, in msgpack."""
    letters = []
    for row, offset in zip(window.rows, window.offsets, strict=True):
        letter = dead_letter_message(
            encode(row), rows_topic, window.partition, offset,
            f"row {row.key!r} (offset {offset}): {reason}",
            row.key.encode(), DEAD_LETTER_ORIGINAL_BYTES,
        )  # fmt: skip
        what = f"the dead letter of row {row.key!r} (offset {offset})"
        letters.append(letter_part(topic, letter, what))
    return letters


class WindowCommits:
    """The stage's deliveries, per partition, and the dead letters it holds back."""

    def __init__(self, outputs: Outputs, deadletter_topic: str) -> None:
        self.outputs = outputs
        self._topic = deadletter_topic
        self._held: dict[TopicPartition, list[tuple[int, Part]]] = {}
        self._committed: dict[TopicPartition, int] = {}
        self._lease: dict[TopicPartition, int] = {}  # the current assignment's, per partition
        self._leases = 0

    def lease(self, partition: TopicPartition) -> int:
        """The lease of the partition's current assignment: what a step read under it
        commits only while it holds (`commit`); a partition revoked and handed back gets
        a new one (`forget`), so the old assignment's windows never commit in the new."""
        if partition not in self._lease:
            self._leases += 1
            self._lease[partition] = self._leases
        return self._lease[partition]

    def hold(self, partition: TopicPartition, record, reason: str) -> None:
        """The dead letter of a rejected `record`, sent with the commit that passes it."""
        letter, what = dead_letter_of(record, reason)
        part = letter_part(self._topic, letter, what)
        self._held.setdefault(partition, []).append((record.offset, part))

    def held(self) -> int:
        return sum(map(len, self._held.values()))

    def forget(self, partition: TopicPartition) -> None:
        """A partition gone: its held letters are its new owner's to write, and the work
        read under its assignment lapses (`lease`)."""
        self._held.pop(partition, None)
        self._committed.pop(partition, None)
        self._lease.pop(partition, None)

    async def commit(
        self,
        partition: TopicPartition,
        windows: list[Part],
        offset: int | None,
        stalled,
        lease: int | None,
    ) -> bool:
        """Deliver `windows` (relQuery parts) and the held letters below `offset` with the
        commit of `offset`, all read under `lease`; nothing if there is nothing new. False
        if the partition was taken away meanwhile (or handed back since `lease`):
        forgotten, its new owner replays it."""
        if offset is None:
            return True
        if lease is None or self._lease.get(partition) != lease:
            return False
        held = self._held.get(partition, [])
        passed = [part for at, part in held if at < offset]
        if not windows and not passed and self._committed.get(partition) == offset:
            return True
        try:
            at = lambda: self._at(partition, offset, lease)  # noqa: E731
            await self.outputs.deliver(partition, windows + passed, at, stalled)
        except Fenced as exc:
            log.info("left %s to its new owner (%s)", partition, exc)
            self.forget(partition)
            return False
        self._committed[partition] = offset
        self._held[partition] = [(at, part) for at, part in held if at >= offset]
        return True


    def _at(self, partition: TopicPartition, offset: int, lease: int) -> tuple[int, str]:
        """The offset commit, asked inside the transaction with the partition's producer:
        work of an ended assignment aborts it (`Fenced`)."""
        if self._lease.get(partition) != lease:
            raise Fenced(f"{partition}: handed back since this step read it")
        return offset, ""


async def commit_all(
    commits: WindowCommits, cutters: dict, windows: dict, stalled, leases: dict
) -> list[TopicPartition]:
    """One delivery per partition with something to commit, each under the lease it was
    read under (`leases`), run side by side; the partitions found taken away."""
    partitions = list(cutters)
    done = await asyncio.gather(
        *(
            commits.commit(p, windows.get(p, []), cutters[p].committable(), stalled, leases.get(p))
            for p in partitions
        )
    )
    return [p for p, ok in zip(partitions, done, strict=True) if not ok]
