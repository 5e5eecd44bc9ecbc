"""The window stage's commits where the broker has transactions: exactly once.

Per input rows partition, one transaction (`kafka.transactions`) holds what a step
settled there: the relQueries of the windows it closed, the dead letters of the rows the
commit passes, and the offset commit itself (the start of the window still open). A
worker killed mid-step leaves an open transaction that its replacement's producer (same
transactional id, `{group}.{topic}.{partition}`) aborts while fencing it, so
`read_committed` readers never see its windows; the replacement resumes from the
committed offset and cuts the same windows under the same ids. No book of published
windows is kept: nothing past the commit is ever visible.

A rejected row at or past the commit point (inside the still-open window) would be read
again after a crash, so its dead letter is held until a commit passes it and then goes
in that commit's transaction. The held letters are those of the rows rejected while one
window is open: the open window closes by rows, bytes or `window_seconds` + lateness, so
they are the rejected rows of at most that span, each letter's original cut to
`DEAD_LETTER_ORIGINAL_BYTES`.

A message the broker refuses for good aborts the transaction (`Refused`, naming it);
the transaction is redone without it: a refused relQuery becomes a dead letter for each
of its rows, a refused dead letter is sent again without the original's bytes, and one
refused in both forms is counted lost (`letter_lost`): nothing stops the partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from relstream.kafka.clients import DEAD_LETTER_ORIGINAL_BYTES
from relstream.kafka.delivery import Refused, Send, dead_letter_of, letter_lost, letter_tries
from relstream.kafka.transactions import PartitionProducers
from relstream.kafka.txfaults import Fenced
from relstream.stream.windowing import Window
from relstream.wire import DeadLetterMessage, encode
from relstream.wire.convert import dead_letter_message

log = logging.getLogger("relstream.worker")


def row_letters(
    window: Window, rows_topic: str, reason: str
) -> list[tuple[DeadLetterMessage, str]]:
    """A dead letter for each row of a window whose relQuery the broker refused for good,
    naming the row, and how log lines name it; its original is the row as decoded, in
    msgpack."""
    letters = []
    for row, offset in zip(window.rows, window.offsets, strict=True):
        letter = dead_letter_message(
            encode(row), rows_topic, window.partition, offset,
            f"row {row.key!r} (offset {offset}): {reason}",
            row.key.encode(), DEAD_LETTER_ORIGINAL_BYTES,
        )  # fmt: skip
        letters.append((letter, f"the dead letter of row {row.key!r} (offset {offset})"))
    return letters


@dataclass
class Part:
    """One message of a transaction, and what replaces it if the broker refuses it."""

    send: Send
    instead: Callable[[Refused], list[Part]] = field(default=lambda refusal: [])


def letter_part(topic: str, letter: DeadLetterMessage, what: str) -> Part:
    """A dead letter; refused, the same without the original's bytes; refused again,
    counted lost."""
    (full, _), (bare, bare_what) = letter_tries(letter, what)

    def lost(refusal: Refused) -> list[Part]:
        letter_lost(letter, refusal)
        return []

    bare_part = Part(Send(topic, encode(bare), bare.key, bare_what), lost)
    return Part(Send(topic, encode(full), full.key, what), lambda refusal: [bare_part])


class WindowTransactions:
    """The stage's transactional producers and the dead letters it holds back."""

    def __init__(self, producers: PartitionProducers, deadletter_topic: str) -> None:
        self.producers = producers
        self._topic = deadletter_topic
        self._held: dict[TopicPartition, list[tuple[int, Part]]] = {}
        self._committed: dict[TopicPartition, int] = {}

    def hold(self, partition: TopicPartition, record, reason: str) -> None:
        """The dead letter of a rejected `record`, sent with the commit that passes it."""
        letter, what = dead_letter_of(record, reason)
        part = letter_part(self._topic, letter, what)
        self._held.setdefault(partition, []).append((record.offset, part))

    def held(self) -> int:
        return sum(map(len, self._held.values()))

    def forget(self, partition: TopicPartition) -> None:
        """A partition gone: its held letters are its new owner's to write."""
        self._held.pop(partition, None)
        self._committed.pop(partition, None)

    async def commit(
        self, partition: TopicPartition, windows: list[Part], offset: int | None, stalled
    ) -> bool:
        """Publish `windows` (relQuery parts), the held letters below `offset`, and commit
        `offset`, in one transaction; nothing if there is nothing new. False if the
        partition was taken away meanwhile: forgotten, its new owner replays it."""
        if offset is None:
            return True
        held = self._held.get(partition, [])
        passed = [part for at, part in held if at < offset]
        if not windows and not passed and self._committed.get(partition) == offset:
            return True
        parts = windows + passed
        while True:
            try:
                sends = [part.send for part in parts]
                await self.producers.transact(partition, sends, lambda: (offset, ""), stalled)
                break
            except Refused as exc:
                parts = _without(parts, exc)
            except Fenced as exc:
                log.info("left %s to its new owner (%s)", partition, exc)
                self.forget(partition)
                return False
        self._committed[partition] = offset
        self._held[partition] = [(at, part) for at, part in held if at >= offset]
        return True


def _without(parts: list[Part], refusal: Refused) -> list[Part]:
    """`parts` with the refused one replaced by what stands in for it (all of them, if the
    refusal names none)."""
    named = [i for i, part in enumerate(parts) if part.send.what == refusal.what]
    log.error("%s; the transaction is redone without it", refusal)
    if not named:
        return [new for part in parts for new in part.instead(refusal)]
    i = named[0]
    return parts[:i] + parts[i].instead(refusal) + parts[i + 1 :]


async def commit_all(
    transactions: WindowTransactions, cutters: dict, windows: dict, stalled
) -> list[TopicPartition]:
    """One transaction per partition with something to commit, run side by side; the
    partitions found taken away."""
    partitions = list(cutters)
    done = await asyncio.gather(
        *(
            transactions.commit(p, windows.get(p, []), cutters[p].committable(), stalled)
            for p in partitions
        )
    )
    return [p for p, ok in zip(partitions, done, strict=True) if not ok]
