from __future__ import annotations

import pytest

from relstream.kafka.brokers import EmbeddedBroker
from relstream.scheduler import CostModel, EngineLimits, Linear


def pytest_collection_modifyitems(config, items):
    """Under xdist (`make test`: `-n 2 --dist loadgroup`) each module's tests run on one
    worker, its module fixtures set up once, and every test that starts vLLM runs on the
    same worker, first: two vLLM engines on two cores slow each other more than they
    overlap, while the broker-and-process tests mostly wait."""
    for item in items:
        vllm = item.get_closest_marker("vllm") is not None
        item.add_marker(pytest.mark.xdist_group("vllm" if vllm else item.nodeid.split("::")[0]))
    items.sort(key=lambda item: item.get_closest_marker("vllm") is None)


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
    from relstream.kafka.brokers import STORED_BROKER

    embedded = EmbeddedBroker(STORED_BROKER, data_dir=tmp_path_factory.mktemp("broker"))
    embedded.start()
    yield embedded
    embedded.stop()
