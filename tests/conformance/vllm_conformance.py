"""A pytest plug-in that runs vLLM's own V1 scheduler tests against relstream's plug-in.

vLLM's tests (tests/v1/core in its source release, fetched by `make test-vllm-conformance`)
build their schedulers from the names `Scheduler` and `AsyncScheduler` in their own
modules (`utils.create_scheduler`, `create_scheduler_with_priority`, ...). Once collected,
each of those names is rebound to relstream's plug-in class (`engine/core/plugin.py`) on
that vLLM class, set to the policy in RELSTREAM_CONFORMANCE: the tests then drive the
plug-in exactly as they drive stock vLLM, and the queue each test asks of vLLM
(`scheduling_policy`) is left as it asks. RELSTREAM_CONFORMANCE=stock leaves vLLM's
classes in place (the reference run).

The models the tests name live on the Hugging Face Hub, which the test machines cannot
reach: a name with no local folder is served by the SmolLM2 folder the engine uses
(`engine.weights.model_dir`), a config only (no weights load). Multimodal tests then
fail alike under stock vLLM and under the plug-in.

Two kinds of vLLM test are left out (`left_out`): those that stand vLLM's class up
without its `__init__` (they test vLLM's own code, whatever class is named), and all but
two cases of the random priority blast (time). After the run each test's outcome is
written to RELSTREAM_CONFORMANCE_OUT (JSON) for `tests/conformance/check.py`.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import sys

import pytest

POLICY = os.environ.get("RELSTREAM_CONFORMANCE", "stock")
STOCK = "stock"
# vLLM's names the tests build schedulers from, in the modules that build them.
REBOUND = ("Scheduler", "AsyncScheduler")
# test_priority_scheduling_blast's cases run here: one with prefix caching, one with
# speculative decoding and KV pressure (its 12 take ~70 s of a run's ~90 s on 2 cores).
BLAST_KEPT = frozenset(
    f"test_priority_scheduling_blast[{case}]"
    for case in ("standard-None-True", "preemption-5-False")
)


def conforming(cls: type, policy: str) -> type:
    """`cls` (a plug-in class) configured with `policy`, as vLLM's engine configures it
    through `additional_config` (`engine/tags.py`), whatever config the test built."""
    from relstream.engine.tags import SETTINGS_KEY

    def __init__(self, vllm_config, *args, **kwargs):
        settings = vllm_config.additional_config.setdefault(SETTINGS_KEY, {})
        settings.setdefault("policy", policy)
        BUILT[cls.__name__] = BUILT.get(cls.__name__, 0) + 1
        cls.__init__(self, vllm_config, *args, **kwargs)

    return type(cls.__name__, (cls,), {"__init__": __init__, "__module__": __name__})


def local_models() -> None:
    """Point the Hub's model names at the local SmolLM2 folder (see the module's doc)."""
    from vllm.config import ModelConfig

    from relstream.engine.weights import model_dir

    folder = str(model_dir("smollm2"))
    original = ModelConfig.__init__

    def __init__(self, *args, **kwargs):
        model = kwargs.get("model")
        if isinstance(model, str) and not os.path.isdir(model):
            kwargs["model"] = folder
            kwargs.pop("tokenizer", None)
        original(self, *args, **kwargs)

    ModelConfig.__init__ = __init__


def pytest_configure(config) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for marker in ("cpu_test", "skip_global_cleanup"):  # vLLM's own, from its conftest
        config.addinivalue_line("markers", f"{marker}: vLLM's")
    local_models()


def left_out(item) -> str | None:
    """Why a test of vLLM's is not run here (None: it runs)."""
    function = getattr(item, "function", None)
    source = inspect.getsource(function) if function is not None else ""
    if re.search(r"object\.__new__\((Async)?Scheduler\)", source):
        # It stands vLLM's class up without its __init__ and sets the attributes vLLM's
        # own code reads: it tests vLLM's code alone, not a scheduler vLLM builds.
        return "builds the scheduler without __init__"
    if item.name.startswith("test_priority_scheduling_blast[") and item.name not in BLAST_KEPT:
        return "the random blast's other cases (time)"
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session, config, items) -> None:
    kept, dropped = [], []
    for item in items:
        (dropped if left_out(item) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
    if POLICY == STOCK:
        return
    from relstream.engine.core.plugin import RelstreamAsyncScheduler, RelstreamScheduler

    classes = {
        "Scheduler": conforming(RelstreamScheduler, POLICY),
        "AsyncScheduler": conforming(RelstreamAsyncScheduler, POLICY),
    }
    for name, module in list(sys.modules.items()):
        if name.startswith("tests.v1.") and module is not None:
            for attr in REBOUND:
                if attr in vars(module):
                    setattr(module, attr, classes[attr])


OUTCOMES: dict[str, str] = {}
BUILT: dict[str, int] = {}  # plug-in schedulers the tests built, by class


def pytest_runtest_logreport(report) -> None:
    if report.failed:
        OUTCOMES[report.nodeid] = "failed"
    elif report.when == "call" or report.skipped:
        OUTCOMES.setdefault(report.nodeid, "skipped" if report.skipped else "passed")


def vllm_release() -> str:
    """The release of the vLLM the tests ran on (the tree first on the path, which may
    be a newer release's than the installed one's)."""
    import vllm

    return vllm.__version__.split("+")[0]


def pytest_sessionfinish(session, exitstatus) -> None:
    out = os.environ.get("RELSTREAM_CONFORMANCE_OUT")
    if out:
        with open(out, "w") as file:
            json.dump(
                {
                    "policy": POLICY,
                    "vllm": vllm_release(),
                    "built": BUILT,
                    "outcomes": dict(sorted(OUTCOMES.items())),
                },
                file,
                indent=0,
            )
