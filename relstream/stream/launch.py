"""Starting relstream's own processes: the Faust worker from its environment, and any
`relstream` command with its output in a log file. The demo, the streaming benchmark and
the tests all start processes through here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from relstream.kafka.brokers import EmbeddedBroker
from relstream.kafka.topics import Topics


def relstream_command(needs_faust: bool) -> list[str]:
    """How to run `relstream` for a role: the worker needs the Faust environment."""
    if needs_faust:
        stream_bin = os.environ.get("RELSTREAM_STREAM_BIN")
        candidates = [Path(stream_bin)] if stream_bin else []
        candidates.append(Path(__file__).resolve().parents[2] / ".venv-stream" / "bin")
        for folder in candidates:
            if (folder / "relstream").exists():
                return [str(folder / "relstream")]
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
) -> subprocess.Popen:
    """The Faust worker as a subprocess (`executable` from `relstream_command(True)`),
    writing `ready_file` once every query reads its rows."""
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
    return spawn_logged(command, log)
