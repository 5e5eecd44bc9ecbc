from __future__ import annotations

import fcntl
import os

import pytest

from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.scheduler import CostModel, Linear
from relstream.scheduler.data import EngineLimits

# The commands the tests start print as to a pipe, whole lines (`cli/common.py`), unless
# COLUMNS says a width: xdist's workers inherit one from the terminal, which folded paths.
os.environ.pop("COLUMNS", None)


def pytest_collection_modifyitems(config, items):
    """Modules that start vLLM first (in their own order), then the rest: under xdist the
    longest modules start early instead of ending the run alone."""
    vllm = {item.module for item in items if item.get_closest_marker("vllm")}
    items.sort(key=lambda item: getattr(item, "module", None) not in vllm)


@pytest.fixture(scope="module", autouse=True)
def one_vllm_module_at_a_time(request, tmp_path_factory):
    """Under xdist (`make test`: `-n 2 --dist loadfile`, a module's tests on one worker) a
    module with a test that starts vLLM holds a lock the workers share for its whole run:
    two vLLM engines on two cores slow each other more than they overlap, while the
    broker-and-process tests beside one mostly wait."""
    module = request.module
    if not any(
        item.get_closest_marker("vllm") and getattr(item, "module", None) is module
        for item in request.session.items
    ):
        yield
        return
    lock = tmp_path_factory.getbasetemp().parent / "vllm.lock"  # the workers' common parent
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


@pytest.fixture
def cost() -> CostModel:
    # L_prefill = 0.01·utok + 0.5, L_decode = 0.1·req + 1.0: round numbers for hand sums.
    return CostModel(prefill=Linear(0.01, 0.5), decode=Linear(0.1, 1.0))


@pytest.fixture
def roomy_limits() -> EngineLimits:
    return EngineLimits(
        max_num_seqs=256, max_num_batched_tokens=1000, kv_capacity_tokens=10**6, block_size=16
    )


@pytest.fixture(scope="module", params=["kafka", "tansu"])
def broker(request, tmp_path_factory):
    """A real broker of each kind relstream starts (Apache Kafka; Tansu, memory only), for
    the module's tests."""
    data = tmp_path_factory.mktemp("broker") if request.param == "kafka" else None
    with EmbeddedBroker(request.param, data_dir=data) as embedded:
        yield embedded


@pytest.fixture(scope="module")
def default_broker(tmp_path_factory):
    """The broker `relstream broker` starts (Apache Kafka, on disk), for the module's tests."""
    with EmbeddedBroker("kafka", data_dir=tmp_path_factory.mktemp("broker")) as embedded:
        yield embedded


@pytest.fixture
def own_broker(tmp_path):
    """An Apache Kafka broker of the test's own, for a test that stops or restarts it."""
    with EmbeddedBroker("kafka", data_dir=tmp_path / "broker") as embedded:
        yield embedded
