"""The README as a test: its walkthrough, its two Python client snippets and its HTTP
example run as written (the engine on `--backend sim`, free ports for the README's), each
command exiting 0 with no traceback, every service alive and traceback-free to the end."""

import json
import sys
from pathlib import Path

import platformdirs
import pytest
from helpers import stream_bin
from readme import Session, blocks, commands, free_port, is_service

# The services that say they are ready by a ready file (`--ready-file`, added here), and
# what the others print once they are, by what their command contains.
READY_FILE = ("relstream worker", "relstream engine", "relstream serve")
READY = {"relstream broker": "ready:", "--follow": None}
CSV_KEYS = ("r1", "r2")  # the rows of the walkthrough's my_reviews.csv


def start_service(session: Session, command: str) -> Path:
    """Start a service of the README and wait until it is ready; its log."""
    for name in READY_FILE:
        if name in command:
            ready_file = session.workdir / f"{name.split()[1]}.ready"
            command = command.replace(name, f"{name} --ready-file {ready_file}")
            return session.start(command, ready_file=ready_file)
    (ready,) = [text for name, text in READY.items() if name in command]
    return session.start(command, ready)


def test_the_tested_blocks_are_the_walkthrough_the_snippets_and_http():
    found = blocks()
    assert set(found) == {"walkthrough", "kafka-python", "client", "http"}
    assert len(commands(found["walkthrough"][1])) == 12
    first_words = [command.split()[0] for command in commands(found["http"][1])]
    assert first_words == [".venv/bin/relstream", "until", "cat", "curl", "curl", "curl"]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("user")
    (workdir / ".venv").symlink_to(Path(sys.prefix))
    (workdir / ".venv-stream").symlink_to(stream_bin().parent)
    ports = {name: free_port() for name in ("9092", "9400", "8000")}
    # The broker keeps its topics in the user's data dir: this user has one of their own,
    # so no earlier run's topics are met.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_DATA_HOME", str(workdir / ".local" / "share"))
        # A home of its own, where the walkthrough's folder goes; the machine's cache
        # (Kafka's jars, the model) kept.
        env.setenv("XDG_CACHE_HOME", platformdirs.user_cache_dir())
        env.setenv("HOME", str(workdir / "home"))
        user = Session(workdir, ports)
        yield user
        crashed = user.stop()
    assert not crashed, "\n\n".join(crashed)


@pytest.fixture(scope="module")
def walkthrough(session) -> dict[str, str]:
    """Run the walkthrough; each one-shot command's output by its first words."""
    outputs = {}
    for command in commands(session.here(blocks()["walkthrough"][1])):
        command = command.replace("relstream engine", "relstream engine --backend sim")
        if session.keeps(command):  # step 0: PATH, and the folder the rest runs in
            continue
        if is_service(command):
            log = start_service(session, command)
            if "--follow" in command:  # the user watches the results come in
                for key in CSV_KEYS:
                    session.wait_for(log, f"{key}:", timeout=120)
        else:
            outputs[" ".join(command.split()[:2])] = session.run(session.shell(command))
    session.prelude.clear()  # the snippets and the HTTP example run from the checkout
    return outputs


@pytest.mark.slow
def test_the_walkthrough_stores_and_shows_every_row(walkthrough, session):
    assert "produced 2 rows" in walkthrough["relstream produce"]
    assert "new results in results.jsonl" in walkthrough["relstream sink"]
    # Run from a folder of the user's own (step 0), not the checkout: its files are there.
    folder = session.workdir / "home" / "relstream-walkthrough"
    assert not (session.workdir / "results.jsonl").exists()
    stored = [json.loads(line) for line in (folder / "results.jsonl").open()]
    assert sorted(row["key"] for result in stored for row in result["rows"]) == list(CSV_KEYS)
    assert "0 dead letters" in walkthrough["relstream deadletters"]
    status = walkthrough["relstream status"]
    assert "relstream.rows.reviews" in status and "worker" in status and "engines" in status
    assert "engine " in status and "relQueries answered" in status, status


@pytest.mark.slow
@pytest.mark.parametrize("name", ["kafka-python", "client"])
def test_a_python_snippet_runs_as_pasted(walkthrough, session, name):
    script = session.workdir / f"{name}.py"
    script.write_text(session.here(blocks()[name][1]))
    output = session.run([sys.executable, str(script)], timeout=120)
    assert "'r1'" in output


def test_the_http_example_runs_as_pasted(session):
    # As pasted: `serve ... &` is not waited for here (its engine takes seconds to
    # start); the block's own `until curl ... /health` line waits, so the first request
    # is answered (on 1d50ea0 the block had no such line and printed nothing).
    outputs = []
    for command in commands(session.here(blocks()["http"][1])):
        if is_service(command):
            session.start(command)
        else:
            outputs.append(session.run(["bash", "-c", command]))
    answered = json.loads(outputs[2])
    assert answered["id"] == "fill-1" and answered["rows"][0]["key"] == "A1"
    assert "event: result" in outputs[3]


def test_the_walkthroughs_query_gives_json_results_that_kcat_prints(tmp_path):
    # The README's kcat line prints results as they are: JSON only if the query asks.
    from relstream.stream.registrations import load_registrations

    (opening,) = [c for c in commands(blocks()["walkthrough"][1]) if "queries.toml <<" in c]
    toml = tmp_path / "queries.toml"
    toml.write_text(opening.split("\n", 1)[1].rsplit("\n", 1)[0] + "\n")
    (query,) = load_registrations(toml)
    assert query.result_format == "json"
