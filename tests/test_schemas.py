import time

import msgpack
import pytest

from relstream.schemas import KINDS, MAX_MESSAGE_BYTES, MessageError, decode, encode, schema

NOW = time.time()
GOOD = {
    "row": {"version": 1, "table": "reviews", "key": "r1", "values": {"review": "ok", "stars": 4}},
    "relquery": {
        "version": 1,
        "id": "q1",
        "template": "Rate {review}",
        "rows": [{"key": "r1", "values": {"review": "good"}}],
        "system_prompt": None,
        "max_output_tokens": 5,
        "submitted_at": NOW,
    },
    "result": {
        "version": 1,
        "id": "q1",
        "rows": [{"key": "r1", "status": "ok", "output": "4", "error": None}],
        "latency": {"waiting": 0.1, "core": 0.2, "tail": 0.3, "total": 0.6},
        "policy": "relserve",
        "model": "smollm2",
        "completed_at": NOW,
    },
    "partial_result": {
        "version": 1,
        "relquery_id": "q1",
        "row_index": 0,
        "key": "r1",
        "status": "ok",
        "output": "4",
    },
    "metric": {
        "version": 1,
        "name": "relquery_latency_s",
        "value": 0.6,
        "labels": {"part": "total"},
        "at": NOW,
    },
    "dead_letter": {
        "version": 1,
        "original": b"\xc1",
        "topic": "relstream.rows.reviews",
        "partition": 0,
        "offset": 7,
        "reason": "not valid msgpack",
        "at": NOW,
    },
}


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(kind):
    assert schema(kind)["title"] == kind
    assert decode(kind, encode(kind, GOOD[kind])) == GOOD[kind]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb(GOOD["row"]) + b"\x00", "not valid msgpack"),
        (b"\xa2\xff\xfe", "not valid UTF-8"),
        (msgpack.packb([1, 2]), "expected a map"),
        (msgpack.packb({**GOOD["row"], "version": 2}), "field version"),
        (msgpack.packb({**GOOD["row"], "values": {"a": [1]}}), "field values.a"),
        (
            msgpack.packb({k: v for k, v in GOOD["row"].items() if k != "key"}),
            "'key' is a required",
        ),
    ],
)
def test_bad_messages_name_what_is_wrong(data, reason):
    with pytest.raises(MessageError, match=reason):
        decode("row", data)


def test_nested_field_paths_are_named():
    bad = {**GOOD["relquery"], "rows": [GOOD["relquery"]["rows"][0], {"key": "", "values": {}}]}
    with pytest.raises(MessageError, match=r"field rows\[1\]\.key"):
        encode("relquery", bad)


def test_oversize_messages_are_refused_before_unpacking():
    with pytest.raises(MessageError, match="limit"):
        decode("row", b"\x00" * (MAX_MESSAGE_BYTES + 1))


def test_dead_letter_keeps_raw_bytes():
    with pytest.raises(MessageError, match="original: must be bytes"):
        encode("dead_letter", {**GOOD["dead_letter"], "original": "text"})


@pytest.mark.parametrize(
    "row",
    [
        GOOD["row"],
        {**GOOD["row"], "produced_at": 1.5},
        {**GOOD["row"], "values": {}},
        {**GOOD["row"], "version": True},
        {**GOOD["row"], "version": 1.0},
        {**GOOD["row"], "table": ""},
        {**GOOD["row"], "key": "k" * 513},
        {**GOOD["row"], "values": {"a": [1]}},
        {**GOOD["row"], "values": {"a": {"b": 1}}},
        {**GOOD["row"], "values": {str(i): i for i in range(1025)}},
        {**GOOD["row"], "produced_at": True},
        {**GOOD["row"], "extra": 1},
        {k: v for k, v in GOOD["row"].items() if k != "values"},
    ],
)
def test_fast_row_check_agrees_with_the_schema(row):
    from relstream.schemas import _row_is_valid, _validator

    assert _row_is_valid(row) == _validator("row").is_valid(row)
