"""Wire compatibility with the previous releases, both ways (a rolling upgrade).

`tests/fixtures/schemas/<commit>/` holds the JSON Schemas committed at two earlier
releases: 80b905e, before results carried `cached` and relqueries `fields`, and 5e404c3,
the last release whose decoders refused unknown fields. A schema is that release's
decode rules (`additionalProperties: false` is its `forbid_unknown_fields`), so:

- messages those releases wrote, checked against their own schema, decode today;
- messages written today pass the old rules whenever they use no field the old release
  lacks, which holds because writers leave out every field at its default;
- today's decoders ignore a field they do not know, as the next release may add one.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import msgpack
import msgspec
import pytest
from jsonschema import Draft202012Validator

from relstream.wire import (
    Latency,
    PartialResultMessage,
    RelQueryMessage,
    RelQueryRow,
    ResultMessage,
    ResultRow,
    RowMessage,
    decode,
    encode,
)
from relstream.wire.kinds import MESSAGE_TYPES

FIXTURES = Path(__file__).parents[1] / "fixtures" / "schemas"
RELEASES = ("80b905e", "5e404c3")
NOW = time.time()
TYPES = {
    "row": RowMessage,
    "relquery": RelQueryMessage,
    "result": ResultMessage,
    "partial_result": PartialResultMessage,
}


def old_rules(release: str, kind: str) -> Draft202012Validator:
    """The decode rules of `release` for `kind`, from the schema it committed."""
    return Draft202012Validator(
        json.loads((FIXTURES / release / f"{kind}.schema.json").read_text())
    )


def written_by(release: str) -> dict[str, list[dict]]:
    """Messages as `release` wrote them: every field, defaults included (its writers did
    not omit them), 5e404c3's with the fields it added at their defaults."""
    newer = release == "5e404c3"
    row_extra = {"cached": False} if newer else {}
    relquery_extra = {"fields": None} if newer else {}
    latency = {"queued": 0.5, "waiting": 0.1, "core": 0.2, "tail": 0.3, "total": 1.1}
    return {
        "row": [
            {"version": 1, "table": "reviews", "key": "r1", "values": {"review": "ok", "n": 4}},
            {"version": 1, "table": "t", "key": "r2", "values": {"x": None}, "produced_at": NOW},
        ],
        "relquery": [
            {
                "version": 1,
                "id": "sentiment-0-0",
                "template": "Rate {review}",
                "rows": [{"key": "r1", "values": {"review": "good"}}],
                "system_prompt": None,
                "max_output_tokens": 5,
                "submitted_at": NOW,
                "output": {"choices": ["Positive", "Negative"], "json_schema": None, "regex": None},
                "temperature": 0.0,
                "top_p": 1.0,
                "seed": None,
                "stop": [],
                **relquery_extra,
            }
        ],
        "result": [
            {
                "version": 1,
                "id": "sentiment-0-0",
                "rows": [
                    {"key": "r1", "status": "ok", "output": "4", "error": None, "value": None}
                    | row_extra,
                    {"key": "r2", "status": "error", "output": None, "error": "row r2: too long"}
                    | {"value": None}
                    | row_extra,
                ],
                "latency": latency,
                "policy": "relstream",
                "model": "smollm2",
                "completed_at": NOW,
                "part": 0,
                "parts": 1,
            }
        ],
        "partial_result": [
            {
                "version": 1,
                "relquery_id": "sentiment-0-0",
                "row_index": 0,
                "key": "r1",
                "status": "ok",
                "output": "Positive",
                "error": None,
                "value": None,
                **row_extra,
            }
        ],
    }


def written_today() -> dict[str, list[msgspec.Struct]]:
    """Messages as this release writes them, using only fields every release knows."""
    latency = Latency(queued=0.5, waiting=0.1, core=0.2, tail=0.3, total=1.1)
    return {
        "row": [RowMessage(table="reviews", key="r1", values={"review": "ok"}, produced_at=NOW)],
        "relquery": [
            RelQueryMessage(
                id="sentiment-0-0@1764000000000",
                template="Rate {review}",
                rows=[RelQueryRow(key="r1", values={"review": "good"})],
                max_output_tokens=5,
                submitted_at=NOW,
            )
        ],
        "result": [
            ResultMessage(
                id="sentiment-0-0@1764000000000",
                rows=[
                    ResultRow(key="r1", status="ok", output="Positive"),
                    ResultRow(key="r2", status="error", error="row r2: too long"),
                ],
                latency=latency,
                policy="relstream",
                model="smollm2",
                completed_at=NOW,
            )
        ],
        "partial_result": [
            PartialResultMessage(
                relquery_id="q", row_index=0, key="r1", status="ok", output="Positive"
            )
        ],
    }


CASES = [(release, kind) for release in RELEASES for kind in TYPES]


@pytest.mark.parametrize(("release", "kind"), CASES)
def test_what_a_previous_release_wrote_decodes_today(release, kind):
    for message in written_by(release)[kind]:
        assert old_rules(release, kind).is_valid(message), message  # a real old message
        decoded = decode(TYPES[kind], msgpack.packb(message))
        assert reads_as_written(decoded, message)  # every field it wrote, with its value


def reads_as_written(decoded: object, written: object) -> bool:
    """Whether every field `written` holds (nested too) reads back with its value."""
    if isinstance(written, dict) and isinstance(decoded, msgspec.Struct):
        return all(
            reads_as_written(getattr(decoded, field), value)
            for field, value in written.items()
            if field != "version"  # the struct tag: checked by the decoder itself
        )
    if isinstance(written, list) and isinstance(decoded, list):
        return len(written) == len(decoded) and all(
            reads_as_written(d, w) for d, w in zip(decoded, written, strict=True)
        )
    return decoded == written


@pytest.mark.parametrize(("release", "kind"), CASES)
def test_what_this_release_writes_passes_the_previous_release_rules(release, kind):
    for message in written_today()[kind]:
        wire = msgpack.unpackb(encode(message))
        errors = [e.message for e in old_rules(release, kind).iter_errors(wire)]
        assert not errors, (release, kind, errors)


@pytest.mark.parametrize(
    ("kind", "message", "new_field"),
    [
        (
            "result",
            ResultMessage(
                id="q",
                rows=[ResultRow(key="r1", status="ok", output="x", cached=True)],
                latency=None,
                policy="p",
                model="m",
                completed_at=NOW,
            ),
            "cached",
        ),
        (
            "relquery",
            RelQueryMessage(
                id="q",
                template="Describe",
                rows=[RelQueryRow(key="r1", values={"a": "x"})],
                max_output_tokens=4,
                submitted_at=NOW,
                fields=["a"],
            ),
            "fields",
        ),
    ],
)
def test_a_field_the_oldest_release_lacks_is_written_only_when_it_carries_news(
    kind, message, new_field
):
    # 80b905e cannot read these: its rules name the field. The same message at the field's
    # default leaves it out, so that release reads it (the test above).
    wire = msgpack.unpackb(encode(message))
    errors = " ".join(e.message for e in old_rules("80b905e", kind).iter_errors(wire))
    assert repr(new_field) in errors
    assert old_rules("5e404c3", kind).is_valid(wire)


@pytest.mark.parametrize("kind", TYPES)
def test_a_field_from_a_later_release_is_ignored_today(kind):
    # Forward compatibility: fails if any decoder forbids unknown fields again.
    message = written_by("5e404c3")[kind][0]
    later = {**message, "from_the_future": {"any": [1, 2]}}
    if kind == "result":
        later["rows"] = [{**row, "later_row_field": 1} for row in message["rows"]]
        later["latency"] = {**message["latency"], "later_latency_field": 2.0}
    if kind == "relquery":
        later["rows"] = [{**row, "later_row_field": 1} for row in message["rows"]]
        later["output"] = {**message["output"], "later_output_field": True}
    assert decode(TYPES[kind], msgpack.packb(later)) == decode(TYPES[kind], msgpack.packb(message))


def wire_structs() -> set[type]:
    """Every struct type a message is made of, found through the field types."""
    found: set[type] = set()
    pending = list(MESSAGE_TYPES)
    while pending:
        struct = pending.pop()
        if struct in found:
            continue
        found.add(struct)
        for field in msgspec.structs.fields(struct):
            pending.extend(_structs_in(msgspec.inspect.type_info(field.type)))
    return found


def _structs_in(info: msgspec.inspect.Type) -> list[type]:
    if isinstance(info, msgspec.inspect.StructType):
        return [info.cls]
    children: list[msgspec.inspect.Type] = []
    for name in ("types", "item_type", "key_type", "value_type"):
        value = getattr(info, name, None)
        if isinstance(value, tuple):
            children.extend(value)
        elif value is not None:
            children.append(value)
    return [struct for child in children for struct in _structs_in(child)]


def test_every_wire_struct_reads_unknown_fields_and_writes_no_defaults():
    structs = wire_structs()
    assert {ResultRow, Latency, RelQueryRow} <= structs
    for struct in structs:
        config = struct.__struct_config__
        assert not config.forbid_unknown_fields, struct.__name__
        assert config.omit_defaults, struct.__name__


def test_a_null_row_is_a_status_no_earlier_release_reads():
    # "null" (NULL in, NULL out) is a value the earlier releases' status enum lacks: a
    # result holding such a row is refused by them (README: upgrade readers first), while
    # every result without one passes their rules (the tests above).
    message = ResultMessage(
        id="q",
        rows=[ResultRow(key="r1", status="null", error="row 'r1': {review} is null")],
        latency=None,
        policy="p",
        model="m",
        completed_at=NOW,
    )
    wire = msgpack.unpackb(encode(message))
    for release in RELEASES:
        errors = " ".join(e.message for e in old_rules(release, "result").iter_errors(wire))
        assert "'null' is not one of" in errors, (release, errors)
    assert decode(ResultMessage, encode(message)) == message
