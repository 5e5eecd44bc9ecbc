"""The sim backend's simulating children end with it, leaving nothing running into the
interpreter's exit."""

import asyncio
import threading

from relstream.sim.backend import SimRelQueryBackend, SimSettings


def test_shutdown_leaves_no_pool_thread_for_the_interpreters_exit():
    # A pool manager thread still running at exit raced concurrent.futures' own exit
    # hook: "OSError: [Errno 9] Bad file descriptor" on the door's stderr in CI.
    backend = SimRelQueryBackend(SimSettings(processes=1))
    asyncio.run(backend.start())
    managers = [t for t in threading.enumerate() if type(t).__name__ == "_ExecutorManagerThread"]
    assert managers and all(t.is_alive() for t in managers)
    backend.shutdown()
    assert not [t for t in managers if t.is_alive()]
