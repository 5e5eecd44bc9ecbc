"""Free field order: an instruction and the fields whose order the user left free. Each
prompt lists the fields the relQuery's rows share most first; a plain template keeps its
exact text; answers map to their rows (the sim backend echoes each prompt)."""

import asyncio

from relstream.backend import run
from relstream.fieldlayout import shared_first
from relstream.model import RelQuery, Row, Template, prepare_row
from relstream.sim.backend import SimRelQueryBackend
from relstream.wire import decode, encode
from relstream.wire.convert import relquery_from_message, relquery_message
from relstream.wire.messages import RelQueryMessage

DESCRIPTION = "A waterproof hiking boot with a Vibram sole and a padded collar."


def reviews() -> list[Row]:
    # One product's description on every row; the titles and texts all differ.
    return [
        Row(f"r{i}", {"title": f"Review {i}", "text": f"Text {i}", "description": DESCRIPTION})
        for i in range(4)
    ]


def test_the_field_shared_most_leads_and_ties_keep_the_given_order():
    # description: 3 repeats x 63 chars saved; title and text: nothing repeats.
    assert (
        shared_first(reviews(), ["title", "text", "description"])
        == [("description", "title", "text")] * 4
    )
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


def test_the_layout_stops_at_its_budget_and_every_row_keeps_every_field():
    # Given order colour, size, brand. Value visits: the root group scores 4 rows over 3
    # fields and groups them by brand, 4 x (3 + 1) = 16; brand Alpha1's group (rows 0-1)
    # and Bravo2's (rows 2-3) cost 2 x (2 + 1) = 6 each; then rows 0-1 under colour red
    # and rows 2-3 under size XL cost 2 x (1 + 1) = 4 each, and save nothing: 36 in all.
    rows = [
        Row("0", {"brand": "Alpha1", "colour": "red", "size": "S"}),
        Row("1", {"brand": "Alpha1", "colour": "red", "size": "M"}),
        Row("2", {"brand": "Bravo2", "colour": "blue", "size": "XL"}),
        Row("3", {"brand": "Bravo2", "colour": "green", "size": "XL"}),
    ]
    fields = ["colour", "size", "brand"]
    whole = [("brand", "colour", "size")] * 2 + [("brand", "size", "colour")] * 2
    assert shared_first(rows, fields, budget=36) == whole
    assert shared_first(rows, fields) == whole  # far within FIELD_LAYOUT_BUDGET
    # 22 = 16 + 6: Bravo2's group is past the budget and keeps colour, size.
    assert shared_first(rows, fields, budget=22) == [("brand", "colour", "size")] * 4
    # Under 16 the root group is past it: every row keeps the given order.
    assert shared_first(rows, fields, budget=15) == [tuple(fields)] * 4


class CountingValues(dict):
    """A row's values that count the layout's visits (`get`)."""

    visits = 0

    def get(self, key, default=None):
        CountingValues.visits += 1
        return super().get(key, default)


def test_the_layout_never_visits_more_values_than_its_budget():
    # 200 rows x 64 fields of 3 values each, f10 the same long text on every row: laid
    # out whole it would visit about 200 x 64^2 / 2 = 409,600 values. The root group
    # costs 200 x 65 = 13,000.
    fields = [f"f{j}" for j in range(64)]
    rows = [
        Row(str(i), CountingValues({name: f"v{(i * j) % 3}" for j, name in enumerate(fields)}))
        for i in range(200)
    ]
    for row in rows:
        row.values["f10"] = "the same long description on every row"
    CountingValues.visits = 0
    orders = shared_first(rows, fields, budget=20_000)
    assert 13_000 <= CountingValues.visits <= 20_000
    assert all(sorted(order) == sorted(fields) for order in orders)
    assert all(order[0] == "f10" for order in orders)  # the root group was laid out
    relquery = RelQuery("q", Template("Rate."), rows, 4, fields=tuple(fields))
    assert all(prepare_row(relquery, i).prompt.count("\n") == 64 for i in range(200))


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
    from relstream_lab.prefix.sim import computed_tokens

    first, again, sharing_one_block = list(range(8)), list(range(8)), [0, 1, 2, 3, 9]
    # Blocks of 4: the first computes 8; the same prompt hits both blocks but computes
    # its last token again; the third hits one block and computes 1.
    assert computed_tokens([first, again, sharing_one_block], 4, set()) == 8 + 1 + 1
