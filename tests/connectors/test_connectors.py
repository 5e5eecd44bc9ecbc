"""Sources and sinks, including a real PostgreSQL server started for the tests."""

import csv
import glob
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import msgpack
import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from relstream.connectors.sinks import CsvSink, JsonlSink, default_group, open_sink
from relstream.connectors.sources import read_query, read_rows
from relstream.kafka.tools.brokers import free_port
from relstream.wire import ResultMessage, encode, validate
from relstream.wire.messages import RelQueryRow

RESULT_FIELDS = {
    "version": 1,
    "id": "q1",
    "rows": [
        {"key": "a", "status": "ok", "output": "Yes", "error": None},
        {"key": "b", "status": "error", "output": None, "error": "row 'b' is empty"},
    ],
    "latency": {"waiting": 0.1, "core": 0.2, "tail": 0.3, "total": 0.6},
    "policy": "relserve",
    "model": "smollm2",
    "completed_at": 0.0,
}
RESULT = validate(ResultMessage, RESULT_FIELDS)


def test_file_sources_read_csv_jsonl_and_parquet(tmp_path):
    (tmp_path / "t.csv").write_text("id,review\n7,good\n9,bad\n")
    (tmp_path / "t.jsonl").write_text(
        '{"id": 7, "review": "good", "tags": ["a"]}\n\n{"id": 9, "review": "bad"}\n'
    )
    pq.write_table(pa.table({"id": [7, 9], "review": ["good", "bad"]}), tmp_path / "t.parquet")
    for name in ("t.csv", "t.jsonl", "t.parquet"):
        rows = list(read_rows(tmp_path / name, "reviews", key_column="id"))
        assert [(r.key, r.values["review"]) for r in rows] == [("7", "good"), ("9", "bad")], name
        assert all(msgpack.unpackb(encode(r))["version"] == 1 for r in rows)
        assert all(r.table == "reviews" for r in rows)
    jsonl = list(read_rows(tmp_path / "t.jsonl", "reviews"))
    assert jsonl[0].values["tags"] == '["a"]'  # non-scalars travel as their JSON text


def test_file_sources_name_bad_input(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: expected a JSON object"):
        list(read_rows(tmp_path / "bad.jsonl", "t"))
    with pytest.raises(ValueError, match="unknown format"):
        list(read_rows(tmp_path / "t.xlsx", "t"))


@pytest.mark.parametrize(("sink_class", "name"), [(JsonlSink, "out.jsonl"), (CsvSink, "out.csv")])
def test_file_sinks_store_each_relquery_once(tmp_path, sink_class, name):
    path = tmp_path / name
    sink = sink_class(path)
    assert sink.write(RESULT) is True
    assert sink.write(RESULT) is False
    sink.close()
    reopened = sink_class(path)  # a restarted sink still knows what it stored
    assert reopened.write(RESULT) is False
    assert reopened.write(msgspec.structs.replace(RESULT, id="q2")) is True
    reopened.close()
    lines = path.read_text().splitlines()
    if name.endswith(".jsonl"):
        assert [json.loads(line)["id"] for line in lines] == ["q1", "q2"]
    else:
        assert lines[0].startswith("relquery_id,query,row_key") and len(lines) == 1 + 2 * 2


def test_a_csv_sink_widens_for_input_columns_and_old_files(tmp_path):
    # A file from before the query column; a result of one table, then of another.
    path = tmp_path / "out.csv"
    path.write_text("relquery_id,row_key,status,output,error,queued,waiting,core,tail,total\n"
                    "old-0-0,z,ok,No,,,,,,\n")  # fmt: skip
    inputs = {
        "sentiment-0-0@1": [RelQueryRow(key="a", values={"review": "dry"}),
                            RelQueryRow(key="b", values={"review": "wet"})],
        "stars-1-0@1": [RelQueryRow(key="a", values={"stars": 4})],
        "stars-1-5@1": [RelQueryRow(key="c", values={"stars": 5})],
    }  # fmt: skip
    sink = CsvSink(path, inputs.get)
    sink.write(msgspec.structs.replace(RESULT, id="sentiment-0-0@1"))
    for relquery_id in ("stars-1-0@1", "stars-1-5@1"):
        sink.write(msgspec.structs.replace(RESULT, id=relquery_id, rows=RESULT.rows[:1]))
    sink.close()
    with path.open(newline="") as handle:
        stored = [
            (row["relquery_id"], row["query"], row["row_key"], row["input.review"],
             row["input.stars"])
            for row in csv.DictReader(handle)
        ]  # fmt: skip
    assert stored == [
        ("old-0-0", "", "z", "", ""),
        ("sentiment-0-0@1", "sentiment", "a", "dry", ""),
        ("sentiment-0-0@1", "sentiment", "b", "wet", ""),
        # the relQuery's row 0 is keyed c, the result's a: not its input
        ("stars-1-0@1", "stars", "a", "", "4"),
        ("stars-1-5@1", "stars", "a", "", ""),
    ]


def _postgres_binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))), None
    )
    if found is None:
        pytest.fail(f"PostgreSQL's {name} is not installed: run `make setup`")
    return found


@pytest.fixture(scope="module")
def postgres():
    """A throwaway PostgreSQL server on a free loopback port (as Debian's postgres user
    when running as root: the server refuses to run as root)."""
    data = Path(tempfile.mkdtemp(prefix="relstream-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        os.chown(data, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    subprocess.run(
        [
            *prefix,
            _postgres_binary("initdb"),
            "-D",
            str(data / "db"),
            "-U",
            "relstream",
            "--auth=trust",
        ],
        check=True,
        capture_output=True,
    )
    port = free_port()
    server = subprocess.Popen(
        [
            *prefix,
            _postgres_binary("postgres"),
            "-D",
            str(data / "db"),
            "-p",
            str(port),
            "-k",
            str(data),
            "-h",
            "127.0.0.1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    dsn = f"postgresql://relstream@127.0.0.1:{port}/postgres"
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            psycopg.connect(dsn).close()
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                server.kill()
                raise
            time.sleep(0.2)
    yield dsn
    server.terminate()
    server.wait(30)
    shutil.rmtree(data, ignore_errors=True)


def test_postgres_source_streams_a_query(postgres):
    import psycopg

    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute("CREATE TABLE reviews (id int PRIMARY KEY, review text, stars numeric)")
        conn.execute("INSERT INTO reviews VALUES (1, 'dry feet', 4.5), (2, 'peeled', 1)")
    rows = list(read_query(postgres, "SELECT * FROM reviews ORDER BY id", "reviews", "id"))
    assert [(r.key, r.values["review"]) for r in rows] == [("1", "dry feet"), ("2", "peeled")]
    assert rows[0].values["stars"] == "4.5"  # numeric travels as exact text


def test_postgres_sink_is_idempotent_on_relquery_id(postgres):
    import psycopg

    sink = open_sink(postgres)
    assert sink.write(RESULT) is True
    assert sink.write(RESULT) is False
    sink.close()
    with psycopg.connect(postgres) as conn:
        stored = conn.execute(
            "SELECT row_key, status, output, total FROM relstream_results ORDER BY row_index"
        ).fetchall()
    assert stored == [("a", "ok", "Yes", 0.6), ("b", "error", None, 0.6)]


def test_postgres_sink_carries_the_query_and_with_inputs_the_input_values(postgres):
    import psycopg

    inputs = {"sentiment-2-7@1": [RelQueryRow(key="a", values={"review": "dry", "stars": 4})]}
    sink = open_sink(postgres, inputs.get)
    result = msgspec.structs.replace(RESULT, id="sentiment-2-7@1")
    assert sink.write(result) is True
    sink.close()
    with psycopg.connect(postgres) as conn:
        stored = conn.execute(
            "SELECT query, row_key, input FROM relstream_results"
            " WHERE relquery_id = 'sentiment-2-7@1' ORDER BY row_index"
        ).fetchall()
    assert stored == [("sentiment", "a", {"review": "dry", "stars": 4}), ("sentiment", "b", None)]


def test_each_sink_target_has_a_group_of_its_own_the_same_on_every_run(tmp_path, monkeypatch):
    def named(name: str, known: str) -> str:
        return f"relstream-sink-{name}-{hashlib.sha256(known.encode()).hexdigest()[:8]}"

    assert default_group("/data/results.jsonl") == named("results.jsonl", "/data/results.jsonl")
    monkeypatch.chdir(tmp_path)  # a relative path is its absolute one
    assert default_group("results.csv") == named("results.csv", str(tmp_path / "results.csv"))
    assert default_group("results.csv") == default_group(str(tmp_path / "results.csv"))
    assert default_group("results.csv") != default_group("results.jsonl")
    # A URL is itself less its password, which may change between runs.
    url = "postgresql://app@db:5432/results"
    assert default_group("postgresql://app:s3cret@db:5432/results") == named("postgresql", url)
    assert default_group("postgresql://app:other@db:5432/results") == named("postgresql", url)


def test_postgres_mistakes_are_one_line_naming_the_server(postgres, tmp_path):
    # A server not reached, a password refused, a query PostgreSQL refuses: each one line
    # naming the server (never the password), where psycopg's traceback ran to 38 lines.
    from click.testing import CliRunner

    from relstream.cli import main

    nowhere = f"postgresql://relstream:secret@127.0.0.1:{free_port()}/postgres"
    runner = CliRunner()
    sink = runner.invoke(main, ["sink", nowhere, "--bootstrap", "127.0.0.1:1"])
    produce = runner.invoke(
        main, ["produce", nowhere, "--query", "SELECT 1", "--table", "t", "--bootstrap",
               "127.0.0.1:1"],
    )  # fmt: skip
    for done in (sink, produce):
        said = done.output.strip()
        assert done.exit_code == 1 and len(said.splitlines()) == 1, said
        assert said.startswith("Error: could not connect to PostgreSQL at 127.0.0.1:"), said
        assert "secret" not in said and "Traceback" not in said
    bad = runner.invoke(
        main, ["produce", postgres, "--query", "SELEC 1", "--table", "t", "--bootstrap",
               "127.0.0.1:1"],
    )  # fmt: skip
    said = bad.output.strip()
    assert bad.exit_code == 1 and len(said.splitlines()) == 1, said
    assert "PostgreSQL refused --query: syntax error at or near" in said, said
