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


def produce(*args: str):
    """`relstream produce` against a port where no broker listens: what is refused is
    refused before anything connects."""
    return CliRunner().invoke(main, ["produce", *args, "--bootstrap", "127.0.0.1:1"])


def test_text_not_in_the_files_encoding_names_its_line_and_encoding_reads_it(tmp_path):
    cp1252 = tmp_path / "rows.csv"
    cp1252.write_bytes(b"id,review\nr1,fine\n" + "r2,café\n".encode("cp1252"))
    done = produce(str(cp1252), "--table", "t")
    assert done.exit_code == 1
    assert f"{cp1252}:3: not utf-8 text (byte 0xe9 at column 7)" in done.output
    assert "--encoding" in done.output and "0 rows sent" in done.output
    rows = list(read_rows(cp1252, "t", "id", encoding="cp1252"))
    assert rows[1].values["review"] == "café"
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_bytes('{"id": "a"}\n{"id": "b", "t": "café"}\n'.encode("latin-1"))
    with pytest.raises(ValueError, match=r"rows.jsonl:2: not utf-8 text"):
        list(read_rows(jsonl, "t", "id"))
    assert [r.key for r in read_rows(jsonl, "t", "id", encoding="latin-1")] == ["a", "b"]


@pytest.mark.parametrize(
    ("name", "text", "line"),
    [
        ("big.csv", "id,review\nr1,ok\nr2,{big}\nr3,ok\n", 3),
        ("big.jsonl", '{{"id": "r1"}}\n{{"id": "r2", "review": "{big}"}}\n{{"id": "r3"}}\n', 2),
        ("bad.jsonl", '{{"id": "r1"}}\nnot json\n{{"id": "r3"}}\n', 2),
        ("bad.csv", "id,review\nr1,ok\nr2,a,b\nr3,ok\n", 3),
    ],
)
def test_a_bad_row_mid_file_sends_nothing_and_is_named_by_its_line_in_every_format(
    tmp_path, name, text, line
):
    # One rule: every row is checked before any is sent; an oversize CSV row used to be
    # found only while sending, after the rows before it had gone.
    path = tmp_path / name
    path.write_text(text.format(big="x" * 300_000))
    done = produce(str(path), "--table", "t", "--key-column", "id")
    assert done.exit_code == 1 and "no Kafka broker" not in done.output, done.output
    assert done.output.startswith(f"Error: {path}:{line}: ")
    assert done.output.rstrip().endswith("; 0 rows sent (a source with a bad row is refused whole)")


def test_an_empty_file_is_an_empty_table_as_a_header_alone_is(tmp_path):
    # Empty inputs alike (issue 49): an empty CSV was an error, an empty JSONL or a
    # header alone a warning with exit 0. Now each warns, sends nothing, exits 0.
    for name in ("empty.csv", "empty.jsonl"):
        empty = tmp_path / name
        empty.write_text("")
        done = produce(str(empty), "--table", "t")
        assert done.exit_code == 0, done.output
        assert done.output.strip() == f"warning: {empty} has no rows: 0 rows sent"


def test_a_header_alone_says_it_sends_nothing_and_asks_no_broker(tmp_path):
    # It printed "produced 0 rows" as if all went well (issue 42's new-user trial).
    header = tmp_path / "header.csv"
    header.write_text("id,review\n")
    done = produce(str(header), "--table", "t")
    assert (
        done.exit_code == 0 and done.output.strip() == f"warning: {header} has no rows: 0 rows sent"
    )


def test_a_table_no_query_reads_is_refused_without_create(tmp_path):
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "{review}"\n')
    rows = tmp_path / "rows.csv"
    rows.write_text("id,review\nr1,fine\n")
    for extra in (("--strict",), ()):  # refused without --create, strict or not
        done = produce(str(rows), "--table", "reveiws", "--config", str(config), *extra)
        assert done.exit_code == 1
        said = " ".join(done.output.split())
        assert f"no query in {config} reads table 'reveiws'; its queries read reviews" in said
        assert "nothing was sent (--create sends them anyway)" in said
        assert "no Kafka broker" not in said


def test_rows_that_lack_a_column_a_reading_query_uses_are_warned_of_before_sending(
    tmp_path, default_broker
):
    # `{reveiw}` in queries.toml (or the wrong file): produce said "produced 2 rows" and
    # the worker dead-lettered both. Now a warning naming the columns, and --strict refuses.
    config = tmp_path / "queries.toml"
    config.write_text('[[query]]\nname = "q"\ntable = "reviews"\ntemplate = "{reveiw} {stars}"\n')
    rows = tmp_path / "rows.csv"
    rows.write_text("id,review,stars\nr1,fine,5\nr2,bad,1\n")
    args = (str(rows), "--table", "reviews", "--key-column", "id", "--config", str(config))
    said = f"query 'q' uses {{reveiw}}, which 2 of 2 rows of {rows} lack: the worker dead-letters"
    refused = produce(*args, "--strict")
    assert refused.exit_code == 1 and "nothing was sent" in refused.output
    assert said in " ".join(refused.output.split()) and "no Kafka broker" not in refused.output
    sent = CliRunner().invoke(main, ["produce", *args, "--bootstrap", default_broker.bootstrap])
    assert sent.exit_code == 0, sent.output
    assert said in " ".join(sent.output.split()) and "produced 2 rows" in sent.output
