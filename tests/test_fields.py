"""Free field order: an instruction and the fields whose order the user left free. Each
prompt lists the fields the relQuery's rows share most first; a plain template keeps its
exact text; answers map to their rows (the sim backend echoes each prompt)."""

import asyncio

from relstream.backend import run
from relstream.model import RelQuery, Row, Template, prepare_row, shared_first
from relstream.schemas import decode, encode
from relstream.schemas.convert import relquery_from_message, relquery_message
from relstream.schemas.messages import RelQueryMessage
from relstream.sim.backend import SimRelQueryBackend

DESCRIPTION = "A waterproof hiking boot with a Vibram sole and a padded collar."


def reviews() -> list[Row]:
    # One product's description on every row; the titles and texts all differ.
    return [
        Row(f"r{i}", {"title": f"Review {i}", "text": f"Text {i}", "description": DESCRIPTION})
        for i in range(4)
    ]


def test_the_field_shared_most_leads_and_ties_keep_the_given_order():
    # description: 3 repeats x 63 chars saved; title and text: nothing repeats.
    assert shared_first(reviews(), ["title", "text", "description"]) == [
        ("description", "title", "text")
    ] * 4
    rows = [Row(key, {"x": "same", "y": "longer same"}) for key in "ab"]
    assert shared_first(rows, ["x", "y"]) == [("y", "x")] * 2  # 11 chars saved against 4


def test_each_group_orders_its_remaining_fields_by_what_it_shares():
    # Rows 0-1 share brand Alpha1 and colour red; rows 2-3 brand Bravo2 and size XL.
    rows = [
        Row("0", {"brand": "Alpha1", "colour": "red", "size": "S"}),
        Row("1", {"brand": "Alpha1", "colour": "red", "size": "M"}),
        Row("2", {"brand": "Bravo2", "colour": "blue", "size": "XL"}),
        Row("3", {"brand": "Bravo2", "colour": "green", "size": "XL"}),
    ]
    # brand saves 6 + 6 = 12, colour 3, size 2: brand leads everywhere. Within brand A,
    # colour saves 3 and size 0; within brand B, size saves 2 and colour 0.
    assert shared_first(rows, ["size", "colour", "brand"]) == [
        ("brand", "colour", "size"),
        ("brand", "colour", "size"),
        ("brand", "size", "colour"),
        ("brand", "size", "colour"),
    ]


def test_each_prompt_is_the_instruction_then_the_fields_shared_first():
    relquery = RelQuery(
        "q", Template("Rate this review."), reviews(), 4, fields=("title", "text", "description")
    )
    prompt = prepare_row(relquery, 2).prompt
    assert prompt == (
        f"Rate this review.\ndescription: {DESCRIPTION}\ntitle: Review 2\ntext: Text 2"
    )
    lacking = RelQuery(
        "q", Template("Rate."), [Row("z", {"title": "t"})], 4, fields=("title", "text")
    )
    assert prepare_row(lacking, 0).reason == "row 'z' lacks field(s) text"


def test_a_plain_template_is_rendered_byte_for_byte():
    relquery = RelQuery("q", Template("Rate {title}: {text}"), reviews(), 4)
    assert prepare_row(relquery, 1).prompt == "Rate Review 1: Text 1"
    assert relquery.field_orders == []


def test_free_fields_cross_the_wire_and_the_answers_map_to_their_rows():
    relquery = RelQuery(
        "q", Template("Rate this review."), reviews(), 4, fields=("title", "text", "description")
    )
    message = decode(RelQueryMessage, encode(relquery_message(relquery)))
    assert message.fields == ["title", "text", "description"]
    result = asyncio.run(run(SimRelQueryBackend(), relquery_from_message(message)))
    for row, answer in zip(relquery.rows, result.rows, strict=True):
        assert answer.row_key == row.key
        assert answer.output.splitlines()[1:] == [
            f"description: {DESCRIPTION}",
            f"title: {row.values['title']}",
            f"text: {row.values['text']}",
        ]


def test_the_prefix_count_computes_after_the_longest_cached_run_of_full_blocks():
    from relstream.bench.prefix import computed_tokens

    first, again, sharing_one_block = list(range(8)), list(range(8)), [0, 1, 2, 3, 9]
    # Blocks of 4: the first computes 8; the same prompt hits both blocks but computes
    # its last token again; the third hits one block and computes 1.
    assert computed_tokens([first, again, sharing_one_block], 4, set()) == 8 + 1 + 1
