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


@pytest.fixture(scope="module", params=["noida-db", "tansu"])
def broker(request, tmp_path_factory):
    """A real Kafka-protocol broker of each embedded kind, for the module's tests."""
    embedded = EmbeddedBroker(request.param, data_dir=tmp_path_factory.mktemp("broker"))
    embedded.start()
    yield embedded
    embedded.stop()


@pytest.fixture(scope="module")
def default_broker(tmp_path_factory):
    """The broker `relstream broker` starts unless told otherwise (noida-db, on disk)."""
    from relstream.kafka.tools.brokers import STORED_BROKER

    embedded = EmbeddedBroker(STORED_BROKER, data_dir=tmp_path_factory.mktemp("broker"))
    embedded.start()
    yield embedded
    embedded.stop()


@pytest.fixture
def own_broker(tmp_path):
    """A default broker of the test's own, for a test that restarts it (`noida_kafka`)."""
    from relstream.kafka.tools.brokers import STORED_BROKER

    embedded = EmbeddedBroker(STORED_BROKER, data_dir=tmp_path / "broker")
    embedded.start()
    yield embedded
    embedded.stop()
