"""Starting relstream's own processes and waiting until they serve: the Faust worker from
its environment, any `relstream` command with its output in a log file, and their ready
files (`relstream.ready`), never their log text. The CLI's demo, the lab and the tests
all start and await processes through here."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from relstream.extras import MissingExtra
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker

STREAM_BIN = "RELSTREAM_STREAM_BIN"  # the folder of the worker environment's executables


class WorkerNotFound(MissingExtra):
    """No environment to run the Faust worker from: the message names the setting."""

    def __init__(self, reason: str) -> None:
        self.extras = ["stream"]
        RuntimeError.__init__(
            self,
            f"needs the Faust worker: {reason}. Set {STREAM_BIN} to the bin folder of an "
            "environment with relstream[stream] (e.g. .venv-stream/bin, which make setup "
            "builds), or install relstream[stream] in this one",
        )


def relstream_command(needs_faust: bool) -> list[str]:
    """How to run `relstream` for a role. The worker runs from `RELSTREAM_STREAM_BIN`'s
    `relstream` when that is set, else from this interpreter if it has Faust; no path is
    guessed, so an installed package finds it the same as a checkout (`WorkerNotFound`
    otherwise)."""
    if not needs_faust:
        return [sys.executable, "-m", "relstream"]
    stream_bin = os.environ.get(STREAM_BIN)
    if stream_bin:
        executable = Path(stream_bin) / "relstream"
        if not executable.exists():
            raise WorkerNotFound(f"{STREAM_BIN}={stream_bin} holds no relstream executable")
        return [str(executable)]
    if importlib.util.find_spec("faust") is None:
        raise WorkerNotFound(f"{STREAM_BIN} is not set and this environment has no Faust")
    return [sys.executable, "-m", "relstream"]


def spawn_logged(command: list[str], log: Path) -> subprocess.Popen:
    """`command` with its output appended to `log`: a restarted process keeps the log of
    the one before it."""
    return subprocess.Popen(command, stdout=log.open("a"), stderr=subprocess.STDOUT)


def start_worker(
    executable: list[str],
    broker: EmbeddedBroker,
    config: Path,
    log: Path,
    topics: Topics | None = None,
    app_id: str | None = None,
    ready_file: Path | None = None,
    agents: Path | None = None,
) -> subprocess.Popen:
    """The Faust worker as a subprocess (`executable` from `relstream_command(True)`),
    writing `ready_file` once every query reads its rows; `agents`: a file of your own
    Faust agents (`relstream worker --agents`)."""
    command = [
        *executable,
        "worker",
        "--bootstrap",
        broker.bootstrap,
        "--config",
        str(config),
        "--prefix",
        (topics or Topics()).prefix,
        "--broker-kind",
        broker.kind,
    ]
    if app_id:
        command += ["--app-id", app_id]
    if ready_file:
        command += ["--ready-file", str(ready_file)]
    if agents:
        command += ["--agents", str(agents)]
    return spawn_logged(command, log)


def stop_all(processes: Sequence[subprocess.Popen], wait_s: float = 30.0) -> None:
    """SIGTERM to each process still running, then wait for each up to `wait_s`; one
    that is still running then is killed."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(wait_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def check_alive(processes: Sequence[subprocess.Popen]) -> None:
    """RuntimeError naming the first process that has exited."""
    for process in processes:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(process.args[-8:])} exited with {process.returncode}")


def wait_ready(
    ready_files: Sequence[Path], processes: Sequence[subprocess.Popen], timeout: float
) -> None:
    """Until every process has written its ready file (`--ready-file`: the worker once
    every query reads its rows, the engine once it takes work): work sent earlier would
    count the model's loading as time queued in Kafka. RuntimeError naming the files not
    written if a process exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in ready_files):
        check_alive(processes)
        if time.monotonic() > deadline:
            missing = ", ".join(str(path) for path in ready_files if not path.exists())
            raise RuntimeError(f"not ready after {timeout:g} s: no {missing}")
        time.sleep(0.2)
