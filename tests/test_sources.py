"""Input files as people have them: a byte order mark, semicolons, a key column that is
not there, keys that repeat, nested JSON values."""

import pytest
from click.testing import CliRunner

from relstream.cli import main
from relstream.connectors.sources import read_rows


def test_a_byte_order_mark_and_semicolons_are_read_as_meant(tmp_path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffid,review\nr1,Good\n".encode())
    semicolons = tmp_path / "semi.csv"
    semicolons.write_text('id;review\nr1;"Good, really"\nr2;Bad\n')
    assert [(r.key, r.values) for r in read_rows(bom, "t", "id")] == [
        ("r1", {"id": "r1", "review": "Good"})
    ]
    rows = list(read_rows(semicolons, "t", "id"))
    assert [r.values["review"] for r in rows] == ["Good, really", "Bad"]
    # A comma in a quoted header name does not outvote the semicolons.
    quoted = tmp_path / "quoted.csv"
    quoted.write_text('id;"a, b"\nr1;x\n')
    [row] = read_rows(quoted, "t", "id")
    assert row.values == {"id": "r1", "a, b": "x"}


def test_a_missing_key_column_is_named_with_the_columns_found(tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text("ID,review\nr1,Good\n")
    with pytest.raises(ValueError, match=r"no key column 'id'; the columns are 'ID', 'review'"):
        list(read_rows(csv, "t", "id"))
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"key": "a", "text": "x"}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:1: no key column 'id'"):
        list(read_rows(jsonl, "t", "id"))


def test_a_nested_value_reaches_the_prompt_as_json(tmp_path):
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"id": "a", "tags": ["x", "é"], "meta": {"n": 1}}\n')
    [row] = read_rows(jsonl, "t", "id")
    assert row.values["tags"] == '["x", "é"]' and row.values["meta"] == '{"n": 1}'


def test_repeated_keys_are_refused_when_asked(tmp_path):
    csv = tmp_path / "dup.csv"
    csv.write_text("id,review\nr1,a\nr1,b\nr2,c\n")
    done = CliRunner().invoke(
        main,
        ["produce", str(csv), "--bootstrap", "127.0.0.1:1", "--table", "t", "--key-column",
         "id", "--unique"],
    )  # fmt: skip
    assert done.exit_code == 1
    assert "1 keys appear more than once ('r1')" in done.output


def test_a_given_delimiter_wins_over_the_headers(tmp_path):
    # One semicolon and one tab in the header: read as semicolons, or as told.
    mixed = tmp_path / "rows.csv"
    mixed.write_text("a;b\tc\n1;2\t3\n")
    [row] = read_rows(mixed, "t")
    assert row.values == {"a": "1", "b\tc": "2\t3"}
    [row] = read_rows(mixed, "t", delimiter="\t")
    assert row.values == {"a;b": "1;2", "c": "3"}


def test_a_files_nan_is_null_and_an_infinity_is_refused_naming_the_row(tmp_path):
    # The wire refuses NaN and infinities; a file's NaN is a missing value (pandas').
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"id": "a", "score": NaN}\n{"id": "b", "score": Infinity}\n')
    rows = read_rows(jsonl, "t", "id")
    assert next(rows).values == {"id": "a", "score": None}
    with pytest.raises(ValueError, match=r"row 'b': field values\[...\]: expected a finite"):
        next(rows)
