"""Dead letters sent back where they came from, once their cause is fixed.

A dead letter keeps the bytes and key of the message relstream could not use, and the
topic it came from (`DeadLetterMessage`). Replaying one produces those bytes again, under
that key, to that topic, where the worker (rows) or an engine (relQueries) takes them
as new messages: a row replayed after its query's template was fixed lands in a new
window with a new id, so it is answered once. A letter whose bytes were cut to fit
(`truncated`) goes back as its original read again from its topic, partition and offset
while the topic keeps it (`refetch`); one whose original is gone is counted apart.
Replaying the same letters twice sends them twice: choose them by reason, origin topic
and time (`LetterFilter`). A replay then marks the letters it sent back on the dead-letter
topic (`ReplayedMessage`, `marks`), so `relstream deadletters` says which went back and
when (`replayed_at`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from relstream.wire import DeadLetterMessage
from relstream.wire.letters import MAX_MARKED, LetterRef, ReplayedMessage, letter_ref
from relstream.wire.messages import KIND_HEADER

MARK_HEADERS = [(KIND_HEADER, ReplayedMessage.kind.encode())]  # a mark among the letters


def parse_time(text: str) -> float:
    """Seconds since the epoch from an ISO 8601 time (UTC unless it says otherwise) or a
    number of seconds; a clear error otherwise."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is neither an ISO 8601 time (2026-11-25T10:00) nor seconds since 1970"
        ) from None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=datetime.now().astimezone().tzinfo).timestamp()
    return moment.timestamp()


@dataclass(frozen=True)
class LetterFilter:
    """Which letters to replay: all by default."""

    reason: str | None = None  # a regular expression searched in the reason
    topic: str | None = None  # the topic the message came from
    since: float | None = None  # dead-lettered at or after (seconds since the epoch)
    until: float | None = None  # dead-lettered before

    def __post_init__(self) -> None:
        if self.reason is not None:
            try:
                re.compile(self.reason)
            except re.error as exc:
                raise ValueError(f"{self.reason!r} is not a regular expression: {exc}") from None

    def matches(self, letter: DeadLetterMessage) -> bool:
        if self.reason is not None and not re.search(self.reason, letter.reason):
            return False
        if self.topic is not None and letter.topic != self.topic:
            return False
        if self.since is not None and letter.at < self.since:
            return False
        return self.until is None or letter.at < self.until


@dataclass
class ReplayPlan:
    """The letters chosen, by origin topic, and those that cannot go back."""

    messages: dict[str, list[tuple[bytes | None, bytes]]] = field(default_factory=dict)
    cut: list[DeadLetterMessage] = field(default_factory=list)  # chosen, bytes cut: refetch
    skipped: int = 0  # not chosen by the filter
    by_topic: Counter[str] = field(default_factory=Counter)
    refs: list[LetterRef] = field(default_factory=list)  # of the letters to send back

    @property
    def count(self) -> int:
        return sum(self.by_topic.values())

    def add(
        self,
        messages: dict[str, list[tuple[bytes | None, bytes]]],
        letters: Iterable[DeadLetterMessage],
    ) -> None:
        """Originals read again for the letters `cut` (`refetch`), to send back too, and
        the `letters` they were read for."""
        for topic, found in messages.items():
            self.messages.setdefault(topic, []).extend(found)
            self.by_topic[topic] += len(found)
        self.refs.extend(letter_ref(letter) for letter in letters)


def plan_replay(letters: Iterable[DeadLetterMessage], chosen: LetterFilter) -> ReplayPlan:
    """The (key, bytes) to send back to each origin topic, in the letters' order."""
    plan = ReplayPlan()
    for letter in letters:
        if not chosen.matches(letter):
            plan.skipped += 1
        elif letter.truncated:
            plan.cut.append(letter)
        else:
            plan.messages.setdefault(letter.topic, []).append((letter.key, letter.original))
            plan.by_topic[letter.topic] += 1
            plan.refs.append(letter_ref(letter))
    return plan


def marks(refs: list[LetterRef], at: float) -> list[ReplayedMessage]:
    """The marks naming `refs` as replayed at `at`, `MAX_MARKED` letters a mark."""
    return [
        ReplayedMessage(letters=refs[i : i + MAX_MARKED], to="relstream replay", at=at)
        for i in range(0, len(refs), MAX_MARKED)
    ]


def replayed_at(found: Iterable[ReplayedMessage]) -> dict[LetterRef, float]:
    """When each letter the marks name was last replayed."""
    when: dict[LetterRef, float] = {}
    for mark in found:
        for ref in mark.letters:
            when[ref] = max(when.get(ref, mark.at), mark.at)
    return when
