import json
import os
import subprocess
import sys
from functools import partial

import pytest
from click.testing import CliRunner
from helpers import assigned_members, entry_point_folder, wait_until

from relstream.cli import main
from relstream_lab.cli import main as lab
from relstream_lab.paper.decision import run_decision_benchmark


def test_bench_writes_every_output(tmp_path):
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        lab,
        [
            "bench",
            "paper",
            "--bundled",
            "--relqueries",
            "6",
            "--rates",
            "0.5,2",
            "--policies",
            "v1-fcfs,relserve",
            "--no-decision-benchmark",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads((out / "results.json").read_text())
    assert {(r["policy"], r["rate"]) for r in document["runs"]} == {
        (p, r) for p in ("v1-fcfs", "relserve") for r in (0.5, 2.0)
    }
    assert all(r["relqueries"] == 6 for r in document["runs"])
    assert (out / "latency_vs_rate.png").stat().st_size > 1000
    assert (out / "breakdown.png").stat().st_size > 1000
    command = "relstream-lab bench paper --profile a100-opt13b --policies v1-fcfs,relserve"
    assert command in (out / "README.md").read_text()
    assert document["command"].startswith(command)


def test_bench_rejects_unknown_policies_and_bad_rates():
    runner = CliRunner()
    result = runner.invoke(lab, ["bench", "paper", "--policies", "v1-fcfs,lifo"])
    assert result.exit_code != 0 and "unknown lifo" in result.output
    result = runner.invoke(lab, ["bench", "paper", "--rates", "1,-2"])
    assert result.exit_code != 0 and "positive" in result.output


def test_the_product_lists_only_product_commands_and_the_lab_its_own():
    product = set(main.commands)
    assert not product & {"bench", "drill"} and not any(n.startswith("bench") for n in product)
    assert set(lab.commands) == {"bench", "drill"}
    benches = {"paper", "scheduler-cost", "campaign", "ceiling", "frontier", "repeats"}
    benches |= {"streaming", "faust-agent", "sustained", "zipf", "prefix", "placement", "idle"}
    benches |= {"kv-bound", "gpu-steps", "priority", "fairshare"}
    assert benches == set(lab.commands["bench"].commands)


def test_every_lab_study_is_a_bench_command_with_its_options():
    # The studies once run as `python -m relstream_lab....` are subcommands like the rest.
    runner = CliRunner()
    for words, option in (
        (["bench", "ceiling"], "--load"),
        (["bench", "frontier"], "--stretch"),
        (["bench", "faust-agent"], "--stream-python"),
        (["bench", "scheduler-cost"], "--rows-per-relquery"),
    ):
        result = runner.invoke(lab, [*words, "--help"])
        assert result.exit_code == 0 and option in result.output, result.output


def test_the_engine_names_every_backend_it_can_start(tmp_path):
    # Built-in ones and those registered under the relstream.backends entry point, as an
    # installed package declares them; nothing is loaded to list them.
    registered = entry_point_folder(tmp_path, "relstream.backends", "mine", "nowhere:backend")
    path = os.pathsep.join(filter(None, [str(registered), os.environ.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "relstream", "engine", "--bootstrap", "127.0.0.1:1"]
    finished = subprocess.run(
        [*command, "--backend", "nope"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert finished.returncode == 2
    assert "unknown backend 'nope'; choose one of: vllm, sim, mine" in finished.stderr


def test_a_registered_backend_without_part_of_the_contract_is_refused_at_start(
    broker, tmp_path
):
    # A backend written before `load()` joined the contract: refused in one line naming
    # what it lacks, before it is handed any relQuery, not a load reporter dying later.
    (tmp_path / "oldbackend.py").write_text(
        "class Old:\n    model_name = 'old'\n    policy = 'fcfs'\n"
        "    def backlog_rows(self): return 1\n    async def submit(self, relquery): ...\n"
        "    def shutdown(self): ...\n\ndef make(options): return Old()\n"
    )
    registered = entry_point_folder(tmp_path, "relstream.backends", "old", "oldbackend:make")
    path = os.pathsep.join(filter(None, [str(registered), os.environ.get("PYTHONPATH")]))
    finished = subprocess.run(
        [sys.executable, "-m", "relstream", "engine", "--bootstrap", broker.bootstrap,
         "--broker-kind", broker.kind, "--backend", "old"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert finished.returncode == 1, finished.stderr
    assert "Error: backend 'old' lacks load()" in finished.stderr
    assert "Traceback" not in finished.stderr


def test_what_a_backend_lacks_of_the_contract_is_named_as_the_contract_names_it():
    from relstream.backend import missing_members
    from relstream.sim.backend import SimRelQueryBackend

    class Bare:
        async def submit(self, relquery): ...

    assert missing_members(Bare()) == ["model_name", "policy", "backlog_rows()", "load()",
                                       "shutdown()"]  # fmt: skip
    assert "load()" not in missing_members(SimRelQueryBackend.__new__(SimRelQueryBackend))


def test_fair_share_is_refused_in_one_line_where_it_cannot_apply():
    # Each before anything starts: no broker is asked, no model loaded.
    cases = {
        ("--fair-weight", "a=2"): "--fair-weight needs --fair-share",
        ("--fair-share", "--policy", "v1-fcfs"): "--fair-share needs --policy relstream",
        ("--fair-share", "--backend", "sim"): "--backend sim serves each alone",
        ("--fair-share", "--fair-weight", "a=0"): "'a=0': give QUERY=WEIGHT, a weight above 0",
    }
    for args, says in cases.items():
        done = CliRunner().invoke(main, ["engine", "--bootstrap", "127.0.0.1:1", *args])
        assert done.exit_code == 2 and says in done.output, (args, done.output)


def test_decision_benchmark_builds_the_crowd_it_reports():
    result = run_decision_benchmark(relqueries=100, rows=10)
    assert 240 <= result.running_requests <= 256
    assert 0 < result.waiting_requests <= 1000 - 240
    assert result.timed_decisions == 200 and result.median_us > 0


@pytest.mark.parametrize("memory", [False, True], ids=["kafka", "tansu"])
def test_sigterm_to_the_broker_command_takes_its_broker_down(memory, tmp_path):
    import signal
    import subprocess
    import sys

    import psutil

    where = ["--memory"] if memory else ["--data-dir", str(tmp_path)]
    command = [sys.executable, "-m", "relstream", "broker", *where]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        for line in process.stdout:
            if "ready" in line:
                break
        (broker,) = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
        broker.wait(10)  # raises if the broker outlives the command
        assert not broker.is_running()
    finally:
        process.kill()


UNWINDING = """
import asyncio, sys, time
from relstream.cli.common import unwind_on_sigterm

async def serve():
    try:
        print("serving", flush=True)
        await asyncio.sleep(60)
    finally:
        print("engine shut down", flush=True)  # where a bench shuts its vLLM engine down

unwind_on_sigterm()
asyncio.run(serve())
"""


def test_sigterm_unwinds_a_bench_through_its_finally_blocks():
    # A benchmark shuts its engine down in `finally`; SIGTERM's default ends Python
    # without running it and left vLLM's engine core and worker running (measured).
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", UNWINDING], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline() == "serving\n"
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 128 + signal.SIGTERM
        assert process.stdout.read() == "engine shut down\n"
    finally:
        process.kill()


@pytest.mark.slow
def test_an_engine_asks_its_broker_before_it_loads_the_model():
    # The real backend against a closed port: refused for the whole check (BROKER_CHECK_S,
    # a broker restarting), the model never loaded (vLLM's loading says nothing), exit
    # status 1 and one line saying why.
    import socket
    import subprocess
    import sys
    import time

    from relstream.kafka.clients.aio import BROKER_CHECK_S

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed once the block ends
    command = [sys.executable, "-m", "relstream", "engine", "--backend", "vllm"]
    started = time.monotonic()
    done = subprocess.run(
        [*command, "--bootstrap", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert done.returncode == 1 and took < BROKER_CHECK_S + 10, (took, done.stderr[-2000:])
    assert f"no Kafka broker answered at 127.0.0.1:{port}" in done.stderr
    assert "the model was not loaded" in done.stderr
    assert "Loading" not in done.stdout + done.stderr


def test_output_to_a_pipe_is_not_cut_at_80_columns_and_has_no_escape_codes():
    # A status table or a long group name read by grep or a log: one whole line.
    script = (
        "from relstream.cli.common import console; "
        "console.print('[bold]' + 'relstream-worker-' + 'x' * 150 + '[/bold]')"
    )
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env
    )
    assert run.stdout == "relstream-worker-" + "x" * 150 + "\n"


def test_a_busy_metrics_port_is_one_line_before_the_engine_loads():
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "relstream", "engine", "--backend", "sim"]
        command += ["--bootstrap", "127.0.0.1:9", "--metrics-port", str(port)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    said = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 1
    assert said == [
        f"Error: --metrics-port cannot listen on 127.0.0.1:{port} (Address already in use)"
    ]


def test_a_broker_whose_port_or_data_dir_is_taken_says_so_in_one_line(default_broker, tmp_path):
    # A second `relstream broker` (forgotten in another terminal): on the same port it was
    # reported "ready" (the first broker answered its probe) and waited forever; on the
    # same data dir, the first broker's Kafka died under the second's.
    from relstream.kafka.tools.brokers import free_port

    command = [sys.executable, "-m", "relstream", "broker"]
    port = str(default_broker.port)
    for args, said in (
        (["--port", port, "--data-dir", str(tmp_path)], f"127.0.0.1:{port} is in use"),
        (
            ["--port", str(free_port()), "--data-dir", str(default_broker.data_path)],
            "already running",
        ),
    ):
        done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=30)
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, lines
        assert lines[0].startswith("Error: ") and said in lines[0], lines


def following(process: subprocess.Popen, broker, group: str | None = None) -> bool:
    """Whether a reader command is in its follow loop: with `group`, a member of it holds
    partitions; without (results, deadletters join none), it is connected to the broker,
    which it is only from within the block where a signal asks it to end
    (`cli.common.stop_signals`)."""
    import psutil

    assert process.poll() is None, f"it ended ({process.returncode}) before following"
    if group is not None:
        return assigned_members(broker.bootstrap, group) > 0
    connections = psutil.Process(process.pid).net_connections("tcp")
    return any(c.raddr and c.raddr.port == broker.port for c in connections)


def test_ctrl_c_ends_a_following_sink_results_or_deadletters_quietly(default_broker, tmp_path):
    # Ctrl-C is how `--follow` ends: it printed "Aborted!" with status 1, and the sink
    # never said what it had stored.
    import signal

    from relstream.connectors.sinks import default_group

    target = tmp_path / "results.jsonl"
    for args in (["sink", str(target)], ["results"], ["deadletters"]):
        group = default_group(str(target)) if args[0] == "sink" else None
        command = [sys.executable, "-m", "relstream", *args, "--follow"]
        command += ["--bootstrap", default_broker.bootstrap]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"},  # a hang shows where (SIGABRT)
        )  # fmt: skip
        try:
            wait_until(partial(following, process, default_broker, group), 60, "following")
            process.send_signal(signal.SIGINT)  # in its loop, waiting for results
            said, _ = process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)  # every thread's stack, then the end
            said, _ = process.communicate(timeout=20)
        finally:
            process.kill()
        assert process.returncode == 0 and "Aborted" not in said, said
        expected = {"sink": f"stored 0 new results in {target}", "deadletters": "0 dead letters"}
        expected = expected.get(args[0], "")
        said = " ".join(said.split())  # COLUMNS, where set, wraps a long path
        assert said.startswith(expected) and (expected or not said), said


def test_sigterm_ends_a_following_sink_with_what_it_stored(default_broker, tmp_path):
    # SIGTERM (what `timeout` and systemd send) ends `sink --follow` as Ctrl-C does: at
    # its next poll, with its summary and status 0; it used to die at once, saying nothing.
    import signal

    from relstream.connectors.sinks import default_group

    target = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "relstream", "sink", str(target), "--follow"]
    command += ["--bootstrap", default_broker.bootstrap]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        group = default_group(str(target))
        wait_until(lambda: following(process, default_broker, group), 60, "following")
        process.send_signal(signal.SIGTERM)  # in its loop, waiting for results
        said, _ = process.communicate(timeout=20)
    finally:
        process.kill()
    assert process.returncode == 0, said
    assert " ".join(said.split()).startswith(f"stored 0 new results in {target}"), said


def test_a_sink_run_again_after_a_kill_takes_its_group_back_at_once(default_broker, tmp_path):
    # A `sink --follow` killed (SIGKILL): noida-db never expires it, so the same sink run
    # again waited 60 s and failed ("was given no partition"). A reader is a static member
    # now, as engines and workers are: the run again has its id and its partitions.
    import signal
    import time

    from relstream.client import RelstreamClient
    from relstream.connectors.sinks import default_group

    target = tmp_path / "results.jsonl"
    command = [sys.executable, "-m", "relstream", "sink", str(target), "--follow"]
    killed = subprocess.Popen([*command, "--bootstrap", default_broker.bootstrap])
    group = default_group(str(target))
    try:  # joined, holding every partition
        wait_until(lambda: following(killed, default_broker, group), 60, "joined")
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
    started = time.monotonic()
    with RelstreamClient(default_broker.bootstrap) as client:
        assert list(client.results(default_group(str(target)), join_timeout=20)) == []
    assert time.monotonic() - started < 20
