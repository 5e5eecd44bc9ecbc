import asyncio
import gc
import json
import math
import time

import msgpack
import msgspec
import pytest
from jsonschema import Draft202012Validator

from relstream.wire import (
    KINDS,
    MAX_MESSAGE_BYTES,
    DeadLetterMessage,
    MessageError,
    RelQueryMessage,
    RowMessage,
    decode,
    decode_relquery_stepwise,
    encode,
    validate,
)
from relstream.wire.codec import decode_json
from relstream.wire.jsonschema import committed_schema_text, json_schema, schema_text

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
        "rows": [
            {
                "key": "r1",
                "status": "ok",
                "output": "4",
                "error": None,
                "value": None,
                "cached": False,
            },
            {"key": "r2", "status": "ok", "output": "4", "error": None, "value": 4, "cached": True},
        ],
        "latency": {"queued": 0.5, "waiting": 0.1, "core": 0.2, "tail": 0.3, "total": 1.1},
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
    "metrics": {
        "version": 1,
        "relquery_id": "q1",
        "latency": {"queued": 0.5, "waiting": 0.1, "core": 0.2, "tail": 0.3, "total": 1.1},
        "rows": {"ok": 3, "error": 1},
        "output_tokens": 12,
        "policy": "relstream",
        "model": "smollm2",
        "engine": "host:123",
        "at": NOW,
    },
    "control": {"version": 1, "cancel": "q1"},
    "load_report": {
        "version": 1,
        "engine": "host:42",
        "topic": "relstream.relqueries",
        "partitions": [0, 3],
        "outstanding_s": 1.5,
        "per_prompt_token_s": 0.0001,
        "per_output_token_s": 0.002,
        "templates": ["0a1b2c3d"],
        "at": 1700000000.0,
    },
    "answer": {
        "version": 2,
        "model": "smollm2",
        "identity": "ab" * 32,
        "text": "Paris",
        "output_tokens": 2,
        "mac": bytes(32),
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
    "replayed": {
        "version": 1,
        "letters": [{"topic": "relstream.rows.reviews", "partition": 0, "offset": 7}],
        "to": "relstream replay",
        "at": NOW,
    },
}


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(kind):
    message = validate(KINDS[kind], GOOD[kind])
    assert json_schema(kind)["title"] == kind
    assert decode(KINDS[kind], encode(message)) == message
    # Fields at their default are left out (tests/wire/test_compatibility.py says why); the
    # rest are written as given, and the short form reads back as the same message.
    wire = msgpack.unpackb(encode(message))
    assert set(wire) <= set(GOOD[kind])
    assert validate(KINDS[kind], wire) == message


@pytest.mark.parametrize("kind", KINDS)
def test_committed_json_schemas_match_the_types(kind):
    # `python -m relstream.wire` rewrites them; producers in other languages read them.
    assert committed_schema_text(kind) == schema_text(kind)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xc1", "not valid msgpack"),
        (msgpack.packb(GOOD["row"]) + b"\x00", "not valid msgpack"),
        (b"\xa2\xff\xfe", "not valid UTF-8"),
        (msgpack.packb([1, 2]), "expected a map"),
        (msgpack.packb({**GOOD["row"], "version": 2}), "field version"),
        (msgpack.packb({**GOOD["row"], "values": {"a": [1]}}), r"field values\[\.\.\.\]"),
        (
            msgpack.packb({k: v for k, v in GOOD["row"].items() if k != "key"}),
            "'key' is a required",
        ),
    ],
)
def test_bad_messages_name_what_is_wrong(data, reason):
    with pytest.raises(MessageError, match=reason):
        decode(RowMessage, data)


def test_nested_field_paths_are_named():
    bad = {**GOOD["relquery"], "rows": [GOOD["relquery"]["rows"][0], {"key": "", "values": {}}]}
    with pytest.raises(MessageError, match=r"field rows\[1\]\.key"):
        validate(RelQueryMessage, bad)
    with pytest.raises(MessageError, match=r"field rows\[1\]\.key"):
        asyncio.run(decode_relquery_stepwise(msgpack.packb(bad)))


def test_oversize_messages_are_refused_before_unpacking():
    with pytest.raises(MessageError, match="limit"):
        decode(RowMessage, b"\x00" * (MAX_MESSAGE_BYTES + 1))


def test_dead_letter_keeps_raw_bytes():
    with pytest.raises(MessageError, match="field original: expected `bytes`"):
        validate(DeadLetterMessage, {**GOOD["dead_letter"], "original": "text"})


@pytest.mark.parametrize(
    "row",
    [
        GOOD["row"],
        {**GOOD["row"], "produced_at": 1.5},
        {**GOOD["row"], "values": {}},
        {**GOOD["row"], "version": True},
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
def test_decoder_agrees_with_the_published_schema(row):
    """What a producer validating against row.schema.json sends is what the worker takes."""
    published = Draft202012Validator(json.loads(committed_schema_text("row")))
    try:
        decode(RowMessage, msgpack.packb(row))
        accepted = True
    except MessageError:
        accepted = False
    assert accepted == published.is_valid(row)


def test_a_float_version_is_refused():
    # JSON Schema cannot tell 1.0 from 1; msgpack can, and the decoder wants the integer.
    with pytest.raises(MessageError, match="field version"):
        decode(RowMessage, msgpack.packb({**GOOD["row"], "version": 1.0}))


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_requires_its_version(kind):
    # The published schemas list `version` as required; the decoders agree, on msgpack
    # and on JSON (the HTTP door), for the relquery's stepwise decoder too.
    unversioned = {field: value for field, value in GOOD[kind].items() if field != "version"}
    with pytest.raises(MessageError, match="field version: 'version' is a required field"):
        decode(KINDS[kind], msgpack.packb(unversioned))
    if kind == "relquery":
        with pytest.raises(MessageError, match="'version' is a required field"):
            asyncio.run(decode_relquery_stepwise(msgpack.packb(unversioned)))
        with pytest.raises(MessageError, match="'version' is a required field"):
            decode_json(KINDS[kind], msgspec.json.encode(unversioned))


def largest_relquery() -> bytes:
    """A relquery at the row-count limit, as big as the byte limit allows."""
    rows = [{"key": f"k{i}", "values": {"text": "x" * 55}} for i in range(100_000)]
    data = msgpack.packb({**GOOD["relquery"], "rows": rows})
    assert len(data) <= MAX_MESSAGE_BYTES
    return data


def test_the_largest_relquery_decodes_in_slices_without_stalling_the_loop():
    data = largest_relquery()

    async def decode_while_ticking():
        gaps: list[float] = []

        async def ticker():
            last = time.perf_counter()
            while True:
                await asyncio.sleep(0)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        started = time.perf_counter()
        message = await decode_relquery_stepwise(data)
        elapsed = time.perf_counter() - started
        tick.cancel()
        return message, elapsed, gaps

    # A garbage-collector pass over 100,000 fresh rows stalls any code for ~0.1 s; it is
    # the interpreter's pause, not the decoder's, so it is kept out of the measure.
    gc.disable()
    try:
        message, elapsed, gaps = asyncio.run(decode_while_ticking())
    finally:
        gc.enable()
    assert message == decode(RelQueryMessage, data)
    assert len(message.rows) == 100_000
    assert elapsed < 1.0
    # The loop ran between slices: far more ticks than one, none of them held up long.
    assert len(gaps) > 50 and max(gaps) < 0.1, (len(gaps), max(gaps))


@pytest.mark.parametrize(
    ("count", "reason"),
    [(100_001, "field rows: expected `array` of length <= 100000"), (0, "length >= 1")],
)
def test_row_counts_out_of_bounds_are_refused_naming_the_field(count, reason):
    rows = [{"key": f"k{i}", "values": {}} for i in range(count)]
    data = msgpack.packb({**GOOD["relquery"], "rows": rows})
    with pytest.raises(MessageError, match=reason):
        decode(RelQueryMessage, data)
    with pytest.raises(MessageError, match=reason):  # from the array header, before any row
        asyncio.run(decode_relquery_stepwise(data))


def test_rows_that_are_not_an_array_are_named_by_the_stepwise_decoder():
    data = msgpack.packb({**GOOD["relquery"], "rows": {"key": "k"}})
    with pytest.raises(MessageError, match="field rows: expected `array`, got `object`"):
        asyncio.run(decode_relquery_stepwise(data))


def test_struct_field_docs_reach_the_schema():
    schema = json_schema("relquery")
    assert "latency is measured from it" in schema["properties"]["submitted_at"]["description"]
    assert msgspec.json.decode(schema_text("relquery"))["required"][0] == "version"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize(
    "kind, path, named",
    [
        ("relquery", ("submitted_at",), "field submitted_at: expected a finite number"),
        ("row", ("values", "stars"), "field values[...]: expected a finite number"),
        ("result", ("completed_at",), "field completed_at: expected a finite number"),
        ("result", ("latency", "queued"), "field latency.queued: expected "),
    ],
)
def test_nan_and_infinities_are_refused_naming_the_field(kind, path, named, bad):
    # A NaN submitted_at was served, and its result (a NaN `queued`) decoded by no reader.
    data = json.loads(json.dumps(GOOD[kind]))
    *parents, name = path
    target = data
    for parent in parents:
        target = target[parent]
    target[name] = bad
    with pytest.raises(MessageError) as refused:
        decode(KINDS[kind], msgpack.packb(data))
    assert named in refused.value.reason
