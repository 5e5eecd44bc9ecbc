"""Issue 29 item 3's loop-lag drill: an engine (`relstream engine --backend sim`) serves a
100,000-row relQuery, a 10,000-row one and a 1,000-row x 512-field free-field one among
20 small ones, while its own probe (`service/looplag.py`, a task that sleeps 10 ms on the
engine's loop) records how late it wakes. Tansu: noida-db refuses messages over 1 MiB,
and the big relQueries are 0.3-3.5 MB."""

import asyncio
import random
import time
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from engines import engine_process, wait_for

from relstream.kafka.clients.aio import Subscription
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker, free_port
from relstream.wire import DeadLetterMessage, ResultMessage, decode, encode
from relstream.wire.messages import RelQueryMessage, RelQueryRow
from relstream.wire.parts import ResultJoiner

LAG_BOUND_S = 0.1
FIELDS = [f"f{j}" for j in range(512)]


def relquery(relquery_id: str, rows: list[RelQueryRow], **options) -> RelQueryMessage:
    template = options.pop("template", "Describe {city}.")
    return RelQueryMessage(
        id=relquery_id,
        template=template,
        rows=rows,
        max_output_tokens=4,
        submitted_at=time.time(),
        **options,
    )


def drill_relqueries() -> list[RelQueryMessage]:
    """20 small relQueries, the three large ones among them."""

    def city_rows(count: int, tag: str) -> list[RelQueryRow]:
        return [RelQueryRow(key=f"{tag}{i}", values={"city": f"c{i}"}) for i in range(count)]

    sent = [relquery(f"small-{i}", city_rows(3, f"s{i}-")) for i in range(20)]
    choice = random.Random(0).choice
    wide = [
        RelQueryRow(key=f"w{i}", values={name: choice("abc") for name in FIELDS})
        for i in range(1000)
    ]
    sent.insert(3, relquery("rows-100000", city_rows(100_000, "k")))
    sent.insert(9, relquery("rows-10000", city_rows(10_000, "k")))
    sent.insert(15, relquery("free-1000x512", wide, fields=FIELDS, template="Rate this row."))
    return sent


async def produce(bootstrap: str, topic: str, messages: list[RelQueryMessage]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=16 << 20)
    await producer.start()
    try:
        for message in messages:
            await producer.send_and_wait(topic, encode(message), key=message.id.encode())
    finally:
        await producer.stop()


async def outcomes(broker, topics: Topics, ids: set[str], timeout: float) -> dict[str, str]:
    """Each relQuery id: "answered" (its whole result joined from its parts) or the reason
    it was dead-lettered."""
    seen: dict[str, str] = {}

    async def answers() -> None:
        joiner = ResultJoiner()
        async with Subscription(broker.bootstrap, topics.results, broker_kind=broker.kind) as sub:
            async for message in sub:
                whole = joiner.add(decode(ResultMessage, message.value))
                if whole is not None:
                    seen[whole.id] = "answered"

    async def letters() -> None:
        topic = topics.deadletter
        async with Subscription(broker.bootstrap, topic, broker_kind=broker.kind) as sub:
            async for message in sub:
                letter = decode(DeadLetterMessage, message.value)
                seen[(letter.key or b"").decode()] = letter.reason

    readers = [asyncio.create_task(answers()), asyncio.create_task(letters())]
    deadline = time.monotonic() + timeout
    while not ids <= seen.keys() and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    for reader in readers:
        reader.cancel()
    await asyncio.gather(*readers, return_exceptions=True)
    return seen


def lag_samples(port: int) -> dict[str, float]:
    """The engine's loop-lag histogram (bucket upper bound -> samples at or under it,
    "count", "sum") and its revoked partitions, from /metrics."""
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    page = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            if sample.name == "relstream_event_loop_lag_seconds_bucket":
                found[sample.labels["le"]] = sample.value
            elif sample.name == "relstream_event_loop_lag_seconds_count":
                found["count"] = sample.value
            elif sample.name == "relstream_partitions_revoked_total":
                found["revoked"] = sample.value
    return found


@pytest.mark.slow
def test_an_engine_serving_huge_relqueries_keeps_its_loop_and_its_partitions(tmp_path):
    sent = drill_relqueries()
    ids = {message.id for message in sent}
    port = free_port()
    with EmbeddedBroker("tansu", data_dir=tmp_path / "broker") as broker:
        topics = Topics(prefix=f"t{uuid.uuid4().hex[:6]}.")
        asyncio.run(create_topics(broker.bootstrap, topics.layout()))
        log = tmp_path / "engine.log"
        engine = engine_process(
            broker, topics, f"engine-{uuid.uuid4().hex[:6]}", log, budget_rows=20_000,
            metrics_port=port, extra=["--policy", "v1-fcfs"], scale="0",
        )  # fmt: skip
        try:
            assert wait_for(lambda: _up(port), 60), log.read_text()
            before = lag_samples(port)
            asyncio.run(produce(broker.bootstrap, topics.relqueries, sent))
            seen = asyncio.run(outcomes(broker, topics, ids, timeout=300))
            after = lag_samples(port)
        finally:
            engine.terminate()
            engine.wait(30)
    assert seen.keys() == ids, sorted(ids - seen.keys())
    assert all(reason for reason in seen.values())
    served = after["count"] - before.get("count", 0)
    over = served - (after["0.1"] - before.get("0.1", 0))
    report = {bound: after[bound] - before.get(bound, 0) for bound in after}
    print("loop lag: wakes at or under each bound, revoked partitions:", report)
    assert served > 100, report  # the probe ran all along
    assert after.get("revoked", 0) == 0, report
    # Held: no wake a second late (before the service's work left the loop, building one
    # relQuery took 0.75 s and encoding a result up to 0.9 s on it).
    over_held = served - (after["1.0"] - before.get("1.0", 0))
    assert over_held == 0, f"{over_held:.0f} of {served:.0f} wakes over 1 s: {report}"
    if over:  # held on a machine to itself; beside other work the loop waits for a core
        pytest.xfail(
            f"{over:.0f} of {served:.0f} wakes over {LAG_BOUND_S} s (on a machine running "
            f"other work: docs/architecture/engine.md, 'What still stalls the loop'): {report}"
        )


def _up(port: int) -> bool:
    try:
        return lag_samples(port).get("count", 0) > 0
    except OSError:
        return False
