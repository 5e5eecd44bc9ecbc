"""Structured output and sampling per relQuery: a malformed spec is refused naming the
field, an answer that does not hold is a row's error, and the wire carries both."""

import msgpack
import pytest

from relstream.model import RelQuery, Row, Template
from relstream.outputspec import OutputKind, OutputSpec, OutputSpecError, Sampling
from relstream.wire import MessageError, RelQueryMessage, decode, encode
from relstream.wire.convert import relquery_from_message, relquery_message

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


def test_exactly_one_kind_of_spec_is_given():
    with pytest.raises(OutputSpecError, match="exactly one of choices, json_schema or regex"):
        OutputSpec.build()
    with pytest.raises(OutputSpecError, match=r"\(got choices, regex\)"):
        OutputSpec.build(choices=["a"], regex="a")


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ({"choices": []}, "field output.choices: give at least one choice"),
        ({"choices": ["yes", "yes"]}, "field output.choices: choices repeat"),
        ({"regex": "(unclosed"}, "field output.regex: not a valid regular expression"),
        ({"json_schema": {"type": "nonsense"}}, "field output.json_schema.type: not a valid"),
    ],
)
def test_a_malformed_spec_names_its_field(spec, reason):
    with pytest.raises(OutputSpecError, match=reason.replace(".", r"\.").replace("(", r"\(")):
        OutputSpec.build(**spec)


def test_answers_are_checked_against_the_spec():
    labels = OutputSpec.build(choices=["Positive", "Negative"])
    assert labels.parse("Positive") == (None, None)
    assert "not one of the choices" in labels.parse("Maybe")[1]
    person = OutputSpec.build(json_schema=PERSON)
    assert person.parse('{"name": "Ada", "age": 36}') == ({"name": "Ada", "age": 36}, None)
    assert "not JSON" in person.parse("Ada, 36")[1]
    assert "does not match the schema" in person.parse('{"name": "Ada"}')[1]
    digits = OutputSpec.build(regex=r"\d{3}")
    assert digits.parse("123") == (None, None) and digits.parse("12a")[1]


def test_spec_and_sampling_travel_on_the_wire():
    relquery = RelQuery(
        "q",
        Template("Who is {name}?"),
        [Row("r1", {"name": "Ada"})],
        32,
        output=OutputSpec.build(json_schema=PERSON),
        sampling=Sampling(temperature=0.7, top_p=0.9, seed=7, stop=("\n\n",)),
    )
    back = relquery_from_message(decode(RelQueryMessage, encode(relquery_message(relquery))))
    assert back.output == OutputSpec(OutputKind.JSON_SCHEMA, json_schema=PERSON)
    assert back.sampling == relquery.sampling


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("temperature", -0.1, "temperature"),
        ("top_p", 0.0, "top_p"),
        ("seed", -1, "seed"),
        ("stop", [""], "stop"),
        # An unknown field is ignored (tests/wire/test_compatibility.py); a bad known one is not.
        ("output", {"choices": []}, "choices"),
    ],
)
def test_bad_sampling_and_output_fields_are_named(field, value, reason):
    message = {
        "version": 1,
        "id": "q",
        "template": "{x}",
        "rows": [{"key": "k", "values": {"x": 1}}],
        "max_output_tokens": 4,
        "submitted_at": 0.0,
        field: value,
    }
    with pytest.raises(MessageError, match=reason):
        decode(RelQueryMessage, msgpack.packb(message))


def test_a_malformed_spec_on_the_wire_is_a_message_error_naming_the_field():
    message = relquery_message(RelQuery("q", Template("{x}"), [Row("k", {"x": 1})], 4))
    raw = msgpack.unpackb(encode(message))
    raw["output"] = {"regex": "(unclosed"}
    decoded = decode(RelQueryMessage, msgpack.packb(raw))
    with pytest.raises(MessageError, match=r"field output\.regex"):
        relquery_from_message(decoded)
