import pytest

from relstream.model import LatencyBreakdown, RelQuery, Row, Template, TemplateError


def test_template_renders_columns_and_literal_braces():
    template = Template("Rate {beer/name} {{1-5}}: {review}")
    assert template.columns == ("beer/name", "review")
    assert template.render({"beer/name": "Pils", "review": "crisp"}) == "Rate Pils {1-5}: crisp"


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("Hi {row.__class__}", "{row.__class__}"),
        ("Hi {x[0]}", "{x[0]}"),
        ("Hi {}", "positional"),
        ("Hi {0}", "positional"),
        ("Hi {name!r}", "conversion"),
        ("Hi {name:>10}", "format spec"),
    ],
)
def test_template_rejects_unsafe_placeholders(text, named):
    with pytest.raises(TemplateError, match=named.replace("[", r"\[").replace("{", r"\{")):
        Template(text)


def test_template_rejects_malformed_text():
    with pytest.raises(TemplateError, match="malformed"):
        Template("unclosed {brace")


def test_unknown_columns_are_named():
    template = Template("{review} by {author} on {date}")
    with pytest.raises(TemplateError, match=r"\{author\}, \{date\}"):
        template.check_columns(["review", "rating"])


def test_render_does_not_interpret_values():
    # A value that looks like a placeholder stays text.
    assert Template("{a}").render({"a": "{b.__class__}"}) == "{b.__class__}"


def test_missing_value_fails_only_its_row():
    relquery = RelQuery(
        id="q1",
        template=Template("Summarise {review}"),
        rows=[
            Row("k1", {"review": "good"}),
            Row("k2", {"title": "x"}),
            Row("k3", {"review": "bad"}),
        ],
        max_output_tokens=5,
    )
    requests, failures = relquery.instantiate()
    assert [(r.row_index, r.prompt) for r in requests] == [
        (0, "Summarise good"),
        (2, "Summarise bad"),
    ]
    assert len(failures) == 1
    assert failures[0].row_key == "k2"
    assert "{review}" in failures[0].reason and "'k2'" in failures[0].reason


def test_relquery_requires_positive_output_limit():
    with pytest.raises(ValueError, match="max_output_tokens"):
        RelQuery("q", Template("x"), [], max_output_tokens=0)


def test_latency_breakdown_follows_paper_definitions():
    latency = LatencyBreakdown.from_timestamps(10.0, 12.5, 15.0, 21.0)
    assert (latency.waiting, latency.core, latency.tail, latency.total) == (2.5, 2.5, 6.0, 11.0)
    with pytest.raises(ValueError, match="out of order"):
        LatencyBreakdown.from_timestamps(10.0, 9.0, 15.0, 21.0)


def test_prepare_row_renders_or_names_why_a_row_cannot_run():
    from relstream.model import RowFailure, RowRequest, prepare_row

    relquery = RelQuery(
        "q",
        Template("Capital of {country}?"),
        [Row("a", {"country": "France"}), Row("b", {"country": "  "}), Row("c", {"x": "y"})],
        5,
    )
    ok, empty, missing = (prepare_row(relquery, i) for i in range(3))
    assert ok == RowRequest("q", 0, "a", "Capital of France?")
    assert ok.request_id == "q#0"
    assert empty == RowFailure(1, "b", "row 'b' is empty")
    assert isinstance(missing, RowFailure) and "{country}" in missing.reason
    requests, failures = relquery.instantiate()
    assert requests == [ok] and failures == [empty, missing]
