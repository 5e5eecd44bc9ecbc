"""Service process (and, first thing, each child it starts): children die with it.

vLLM's processes end with the engine process that started them, however it ends.

vLLM runs its engine core, and the core its workers, in processes of their own
(multiprocessing: spawned on CPU and wherever CUDA is initialised, else forked). An
engine killed with SIGKILL runs no code, so it cannot stop them: re-parented to init,
they kept serving and kept their memory (on a GPU, enough that an engine restarted
there could not load; docs/architecture/engine.md, "vLLM on CPU", says how much on CPU).

So every child multiprocessing starts asks Linux, first thing, for SIGKILL when its
parent dies (`PR_SET_PDEATHSIG`), the one way that needs nothing of the dying process:

- a spawned child's command line begins with `die_with_parent(<parent pid>)`, which
  also arms that child's own children (the engine core's workers);
- a forked child arms itself in an `os.register_at_fork` hook (forks of forks too).

SIGKILL rather than SIGTERM: nothing is left to hand work back to, and vLLM's SIGTERM
handler only asks its busy loop to stop, which a model load or a long step delays. The
kernel frees their memory (a GPU's too), and multiprocessing's resource tracker, which
exits once they have, unlinks the shared memory they made.

Linux sends the signal when the *thread* that created the child ends, not the process.
relstream starts vLLM from the main thread, which lives as long as the process; a child
created from any other thread (which may end while the process serves) is not armed,
and keeps vLLM's own behaviour. A parent that died before the child armed is seen by
comparing `getppid()` with its pid. Elsewhere than Linux nothing changes.
"""

from __future__ import annotations

import ctypes
import multiprocessing.spawn
import os
import signal
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
ON_LINUX = sys.platform.startswith("linux")
_ROOT = str(Path(__file__).resolve().parents[2])  # where this `relstream` is imported from
_installed = False
_forking: tuple[int, bool] = (0, False)  # (pid, on its main thread), set before a fork


def children_die_with_this_process() -> None:
    """From now on, every child multiprocessing starts from this process's main thread
    (and, in turn, theirs) is killed when its parent ends. Idempotent."""
    global _installed
    if _installed or not ON_LINUX:
        return
    _installed = True
    spawned_command = multiprocessing.spawn.get_command_line

    def get_command_line(**kwds) -> list[str]:
        command = spawned_command(**kwds)
        if "-c" in command and threading.current_thread() is threading.main_thread():
            at = command.index("-c") + 1
            command[at] = (
                f"import sys; sys.path.insert(0, {_ROOT!r}); "  # spawn's prepare() resets it
                "from relstream.engine.lifetime import die_with_parent; "
                f"die_with_parent({os.getpid()}); {command[at]}"
            )
        return command

    multiprocessing.spawn.get_command_line = get_command_line
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def die_with_parent(parent_pid: int) -> None:
    """In a new child of `parent_pid`: SIGKILL once the parent ends (at once if it
    already has), and the same for this child's own children."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0):
        return  # refused (not expected on Linux): the child lives as vLLM made it
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    children_die_with_this_process()


def _before_fork() -> None:
    global _forking
    _forking = (os.getpid(), threading.current_thread() is threading.main_thread())


def _after_fork_in_child() -> None:
    parent_pid, on_main_thread = _forking
    if on_main_thread:
        die_with_parent(parent_pid)
