"""What replaces a message the broker refuses for good (`kafka.delivery.letters`), one rule for the
worker's windows, the engine's results and every dead letter: hand-made parts, no broker."""

import asyncio

from relstream.kafka.delivery.letters import (
    LOST_LETTERS,
    Part,
    deliver_parts,
    letter_part,
    replaced,
)
from relstream.kafka.delivery.publish import Refused, Send
from relstream.wire import DeadLetterMessage, decode
from relstream.wire.convert import dead_letter_message


def part(name: str, instead=(), whole=None) -> Part:
    return Part(Send("t", name.encode(), None, name), lambda refusal: list(instead), whole)


def names(parts: list[Part]) -> list[str]:
    return [p.send.what for p in parts]


def test_a_refused_part_is_replaced_in_place_and_the_rest_kept():
    parts = [part("w1"), part("w2", [part("l1"), part("l2")]), part("w3")]
    assert names(replaced(parts, Refused("too large", "w2"))) == ["w1", "l1", "l2", "w3"]


def test_the_parts_of_one_whole_fall_together_for_one_letter():
    # a result in three parts, the second refused: one letter in their place, the other
    # relQuery's result kept
    letter = part("letter of q")
    parts = [part("a"), *(part(f"q part {i}", [letter], whole="q") for i in (1, 2, 3)),
             part("b")]  # fmt: skip
    assert names(replaced(parts, Refused("too large", "q part 2"))) == ["a", "letter of q", "b"]


def test_a_refusal_naming_no_part_replaces_every_part():
    parts = [part("w1", [part("l1")]), part("w2")]
    assert names(replaced(parts, Refused("not authorised"))) == ["l1"]


def test_delivery_goes_on_until_the_broker_takes_what_stands_in():
    refusals = {"w": "too large", "letter": "too large"}  # the bare letter passes
    published = []

    async def publish(sends: list[Send]) -> None:
        for send in sends:
            if send.what in refusals:
                raise Refused(refusals.pop(send.what), send.what)
        published.extend(s.what for s in sends)

    letter = dead_letter_message(b"x" * 50, "rows", 0, 7, "bad", b"k", 1000)
    parts = [part("v"), Part(Send("t", b"w", None, "w"),
                             lambda refusal: [letter_part("dl", letter, "letter")])]  # fmt: skip
    sent = asyncio.run(deliver_parts(parts, publish))
    assert published == ["v", "letter (without its bytes)"] == names(sent)
    bare = decode(DeadLetterMessage, sent[1].send.value)
    assert bare.original == b"" and bare.truncated and bare.offset == 7


def test_a_letter_refused_in_both_forms_is_counted_lost_and_the_step_goes_on():
    lost = []
    letter = dead_letter_message(b"x", "rows", 0, 3, "bad", b"k", 1000)
    before = sum(LOST_LETTERS.values())

    async def publish(sends: list[Send]) -> None:
        if sends:
            raise Refused("too large", sends[0].what)

    parts = [letter_part("dl", letter, "letter", lambda: lost.append(1))]
    assert asyncio.run(deliver_parts(parts, publish)) == []  # the offset goes on alone
    assert lost == [1] and sum(LOST_LETTERS.values()) == before + 1
