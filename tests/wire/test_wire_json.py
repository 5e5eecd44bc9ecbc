"""JSON beside msgpack on the wire (`relstream.wire.formats`): a record is read by its
content-type header or, without one, by its first byte; both encodings decode against the
same types, so a message and its errors are the same in either."""

import asyncio
import json

import msgpack
import pytest

from relstream.wire import (
    DeadLetterMessage,
    MessageError,
    RelQueryMessage,
    RelQueryRow,
    ResultMessage,
    ResultRow,
    RowMessage,
    encode,
)
from relstream.wire.codec import decode_relquery_stepwise, encode_json
from relstream.wire.formats import decode_record, encode_as, headers_for, wire_format
from relstream.wire.messages import MAX_RELQUERY_ROWS

ROW = {"version": 1, "table": "reviews", "key": "r1", "values": {"review": "Dry feet.", "n": 4}}
RELQUERY = {
    "version": 1,
    "id": "adhoc-1",
    "template": "Rate {review}",
    "rows": [{"key": "r1", "values": {"review": "good"}}],
    "max_output_tokens": 5,
    "submitted_at": 1.5,
}
MESSAGES = [
    RowMessage(table="reviews", key="r1", values={"review": "ok", "n": 4, "x": None}),
    RelQueryMessage(
        id="q", template="{a}", rows=[RelQueryRow(key="k", values={"a": 1.5})],
        max_output_tokens=3, submitted_at=1.0, result_format="json",
    ),
    ResultMessage(
        id="q", rows=[ResultRow(key="k", status="ok", output="yes", value={"a": [1]})],
        latency=None, policy="fcfs", model="m", completed_at=2.0, part=1, parts=2,
    ),
    DeadLetterMessage(original=b"\x00\xff", key=b"k", topic="t", reason="bad", at=3.0),
]  # fmt: skip


def msgpack_and_json(value: dict) -> list[bytes]:
    return [msgpack.packb(value), json.dumps(value).encode()]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.kind)
def test_every_message_reads_the_same_from_msgpack_and_json(message):
    as_msgpack, as_json = encode_as(message, "msgpack"), encode_as(message, "json")
    assert as_msgpack == encode(message)  # msgpack stays what it was, with no header
    assert headers_for("msgpack") is None
    assert wire_format(message.kind, as_msgpack) == "msgpack"
    assert wire_format(message.kind, as_json) == "json"
    assert json.loads(as_json)["version"] == 1
    assert decode_record(type(message), as_msgpack) == message
    assert decode_record(type(message), as_json) == message
    assert decode_record(type(message), as_json, headers_for("json")) == message


def test_no_msgpack_map_starts_like_json():
    """A msgpack map's first byte is 0x80-0x8f, 0xde or 0xdf; `{` and JSON's whitespace
    are positive fixints, so detection never takes a msgpack message for JSON."""
    for size in (0, 1, 15, 16, 2**16):
        first = msgpack.packb({str(i): i for i in range(size)})[0]
        assert first in range(0x80, 0x90) or first in (0xDE, 0xDF)
    for byte in b"{ \t\r\n":
        assert msgpack.unpackb(bytes([byte])) == byte  # an integer, never a map


def test_the_header_decides_over_the_first_byte():
    as_json = json.dumps(ROW).encode()
    padded = b" \n\t" + as_json
    assert decode_record(RowMessage, padded).key == "r1"  # detected after whitespace
    charset = [("Content-Type", b"application/json; charset=utf-8")]
    assert decode_record(RowMessage, as_json, charset).key == "r1"
    with pytest.raises(MessageError, match=r"not valid msgpack"):
        decode_record(RowMessage, as_json, [("content-type", b"application/msgpack")])
    with pytest.raises(MessageError, match=r"not valid JSON"):
        decode_record(RowMessage, msgpack.packb(ROW), headers_for("json"))
    with pytest.raises(MessageError, match=r"header content-type: 'text/csv' is not one"):
        decode_record(RowMessage, as_json, [("content-type", b"text/csv")])


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"key": 5}, "row: field key: expected `str`, got `int`"),
        ({"values": {"review": [1]}}, "row: field values[...]: expected `bool | int | float | "),
        ({"table": ""}, "row: field table: expected `str` of length >= 1"),
        ({"version": None}, "row: field version: 'version' is a required field"),
    ],
)
def test_a_bad_row_has_the_same_reason_in_either_encoding(change, reason):
    row = {**ROW, **change}
    if change.get("version", 1) is None:
        del row["version"]
    reasons = []
    for value in msgpack_and_json(row):
        with pytest.raises(MessageError) as caught:
            decode_record(RowMessage, value)
        reasons.append(str(caught.value))
    assert reasons[0] == reasons[1]
    assert reasons[0].startswith(reason)


def test_json_that_msgpack_could_not_carry_is_refused_naming_the_field():
    big = json.dumps({**ROW, "values": {"n": 2**64}}).encode()
    with pytest.raises(MessageError, match=r"field values.n: integer out of range"):
        decode_record(RowMessage, big)
    with pytest.raises(MessageError, match=r"^row: not valid JSON \(.*trailing"):
        decode_record(RowMessage, json.dumps(ROW).encode() + b" x")
    with pytest.raises(MessageError, match=r"^row: a string is not valid UTF-8"):
        decode_record(RowMessage, json.dumps(ROW).encode().replace(b"Dry", b"\xff"))


def test_a_json_relquery_decodes_stepwise_naming_its_bad_row():
    good = json.dumps(RELQUERY).encode()
    decoded = asyncio.run(decode_relquery_stepwise(good, json=True))
    assert decoded == decode_record(RelQueryMessage, good)
    bad = {**RELQUERY, "rows": [*RELQUERY["rows"], {"key": "r2", "values": {"v": 2**70}}]}
    with pytest.raises(MessageError, match=r"field rows\[1\].values.v: integer out of range"):
        asyncio.run(decode_relquery_stepwise(json.dumps(bad).encode(), json=True))
    reasons = []
    for count in (0, MAX_RELQUERY_ROWS + 1):
        many = {**RELQUERY, "rows": RELQUERY["rows"] * count}
        for value, as_json in zip(msgpack_and_json(many), (False, True), strict=True):
            with pytest.raises(MessageError) as caught:
                asyncio.run(decode_relquery_stepwise(value, json=as_json))
            reasons.append(caught.value.reason)
    assert reasons[0] == reasons[1] == "field rows: expected `array` of length >= 1"
    assert reasons[2] == reasons[3] == "field rows: expected `array` of length <= 100000"


def test_json_bytes_are_base64():
    letter = MESSAGES[-1]
    assert json.loads(encode_json(letter))["original"] == "AP8="


def test_a_json_result_is_split_by_its_json_size():
    """JSON is larger than msgpack (escapes, names): its parts are sized in JSON."""
    from relstream.wire.parts import ResultJoiner, split_result

    rows = [ResultRow(key=f"k{i}", status="ok", output="\x01" * 200) for i in range(40)]
    result = ResultMessage(id="q", rows=rows, latency=None, policy="p", model="m", completed_at=1.0)
    limit = 4000
    assert len(split_result(result, limit)) < len(split_result(result, limit, "json"))
    parts = split_result(result, limit, "json")
    assert all(len(encode_json(part)) <= limit for part in parts)
    joiner = ResultJoiner()
    whole = [joiner.add(decode_record(ResultMessage, encode_json(p))) for p in parts][-1]
    assert whole == result
