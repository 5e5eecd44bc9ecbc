"""The Faust worker is found from a setting or from the interpreter, never by guessing a
path beside the package: an installed relstream finds it as a checkout does."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from relstream import launch

REPO = Path(__file__).resolve().parents[2]


def worker_bin() -> Path:
    path = Path(os.environ.get(launch.STREAM_BIN, REPO / ".venv-stream" / "bin"))
    if not (path / "relstream").exists():
        pytest.fail(f"no Faust environment at {path}: run `make setup`")
    return path


def test_the_setting_names_the_worker_environment(monkeypatch):
    folder = worker_bin()
    monkeypatch.setenv(launch.STREAM_BIN, str(folder))
    assert launch.relstream_command(True) == [str(folder / "relstream")]


def test_without_the_setting_or_faust_here_the_error_names_the_setting(monkeypatch, tmp_path):
    monkeypatch.delenv(launch.STREAM_BIN, raising=False)
    with pytest.raises(launch.WorkerNotFound, match="RELSTREAM_STREAM_BIN is not set"):
        launch.relstream_command(True)  # this environment (the engine's) has no Faust
    monkeypatch.setenv(launch.STREAM_BIN, str(tmp_path))
    with pytest.raises(launch.WorkerNotFound, match=f"RELSTREAM_STREAM_BIN={tmp_path} holds no"):
        launch.relstream_command(True)


def test_an_interpreter_with_faust_runs_the_worker_itself(tmp_path):
    python = worker_bin() / "python"
    code = "from relstream.launch import relstream_command; print(relstream_command(True))"
    env = {k: v for k, v in os.environ.items() if k != launch.STREAM_BIN}
    shown = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == str([str(python), "-m", "relstream"])


def test_the_launcher_waits_for_ready_files_and_names_those_missing(tmp_path):
    # A process says it is ready by its file, written whole (mark_ready renames it in).
    late, never = tmp_path / "late.ready", tmp_path / "never.ready"
    code = "import sys, time; from relstream.ready import mark_ready\n"
    code += "time.sleep(0.5); mark_ready(sys.argv[1], 'up')"
    writer = subprocess.Popen([sys.executable, "-c", code, str(late)])
    launch.wait_ready([late], [writer], timeout=30)
    assert late.read_text() == "up\n" and writer.wait(10) == 0
    assert [path.name for path in tmp_path.iterdir()] == ["late.ready"]  # no temporary left
    with pytest.raises(RuntimeError, match="exited with 0"):
        launch.wait_ready([late, never], [writer], timeout=30)  # it exited without `never`
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match=f"not ready after 0.5 s: no {never}"):
            launch.wait_ready([late, never], [sleeper], timeout=0.5)
    finally:
        sleeper.kill()
        sleeper.wait()
