"""relstream.engine.cpu: the restart with tcmalloc preloaded runs the command that was
started, whichever it was (relstream-lab's campaign once restarted as `relstream`)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from relstream.engine.cpu import TCMALLOC

SCRIPT = """
import os, sys
from relstream.engine.cpu import reexec_with_tcmalloc
reexec_with_tcmalloc()
print(os.environ["LD_PRELOAD"], sys.argv[1:])
"""


@pytest.mark.skipif(not TCMALLOC.exists(), reason="no tcmalloc on this machine")
def test_the_restart_runs_the_same_program_with_its_arguments(tmp_path):
    script = tmp_path / "command.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run(
        [sys.executable, str(script), "bench", "--seed", "3"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(TCMALLOC), "['bench',", "'--seed',", "'3']"]
