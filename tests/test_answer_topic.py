"""The answer cache backed by the compacted answers topic (`--answer-cache topic`): what
one engine computes, another one (or the same one restarted) answers from the topic
without running the model. On a real broker of each kind, and on the real engine."""

import asyncio
import json
import uuid

import pytest

from relstream.engine.shared import Answer, AnswerCache
from relstream.kafka.clients import create_topics, new_producer, read_messages, start_all
from relstream.kafka.topics import Topics
from relstream.model import RelQuery, Row, Template
from relstream.schemas import AnswerMessage, ResultMessage, decode, encode
from relstream.schemas.convert import relquery_message
from relstream.service.answers import AnswerTopic

MODEL = "smollm2"


def digest(n: int) -> bytes:
    return n.to_bytes(32, "big")  # any 32 bytes: the topic keeps what the cache gives it


def test_answers_one_engine_publishes_fill_the_cache_of_the_next(broker):
    topic = Topics(prefix=f"a{uuid.uuid4().hex[:6]}.").answers

    async def scenario():
        producer = new_producer(broker.bootstrap)
        await start_all(producer)
        try:
            first = AnswerCache(1 << 20, MODEL)
            writer = AnswerTopic(broker.bootstrap, topic, first, producer, broker.kind)
            await writer.start()
            for n in range(3):
                first.remember(digest(n), Answer(f"answer {n}", n + 1))
            first.put(digest(9), Answer("read from elsewhere", 1))  # not published again
            # Another model's answer on the same topic: never served by this model.
            other = AnswerMessage(model="another-model", text="no", output_tokens=1)
            await producer.send_and_wait(topic, encode(other), key=digest(7))
            await writer.stop()
            # A second engine (or this one restarted), its cache 2 entries large.
            entry = AnswerCache.entry_bytes(digest(0), Answer("answer 0", 1))
            second = AnswerCache(2 * entry, MODEL)
            reader = AnswerTopic(broker.bootstrap, topic, second, producer, broker.kind)
            await reader.start()
            await reader.stop()
            return writer.published, reader.loaded, second
        finally:
            await producer.stop()

    published, loaded, cache = asyncio.run(scenario())
    assert published == 3 and loaded == 3  # the other model's answer was skipped
    assert cache.bytes <= cache.max_bytes
    assert cache.get(digest(0)) is None  # the oldest went: the cap holds while loading
    assert cache.get(digest(2)) == Answer("answer 2", 3) and cache.get(digest(7)) is None


@pytest.mark.slow
def test_a_restarted_engine_answers_a_repeated_row_from_the_topic_without_the_model(
    broker, tmp_path
):
    if broker.kind == "noida-db":
        pytest.skip("the engine's part is broker-blind; the topic is tested on both above")
    from relstream.engine.runtime import EngineSettings, RelQueryEngine
    from relstream.service.service import EngineService, ServiceConfig

    topics = Topics(prefix=f"r{uuid.uuid4().hex[:6]}.")
    group = f"e-{uuid.uuid4().hex}"  # the restarted engine's too: it takes only new work
    rows = [Row(c, {"country": c}) for c in ("France", "Japan", "France")]
    template = Template("What is the capital of {country}? Answer with the city name only.")

    async def serve_once(name: str, results_so_far: int) -> tuple[ResultMessage, int]:
        """A fresh engine and service answer one relQuery; returns its result and the
        steps the engine ran."""
        relquery = RelQuery(name, template, rows, max_output_tokens=8)
        log = tmp_path / f"{name}.jsonl"
        settings = EngineSettings(step_log=log, answer_cache_bytes=1 << 20)
        engine = await RelQueryEngine.start(settings)
        config = ServiceConfig(
            broker.bootstrap, topics, group_id=group, broker=broker.kind, answer_topic=True,
        )  # fmt: skip
        stop = asyncio.Event()
        service = asyncio.create_task(EngineService(config, engine).run(stop))
        producer = new_producer(broker.bootstrap)
        await start_all(producer)
        await producer.send_and_wait(
            topics.relqueries, encode(relquery_message(relquery)), key=name.encode()
        )
        await producer.stop()
        count = results_so_far + 1
        raw = await read_messages(broker.bootstrap, topics.results, count, broker.kind, 300)
        stop.set()
        await service
        engine.shutdown()
        mine = [decode(ResultMessage, m.value) for m in raw if m.key == name.encode()]
        steps = [json.loads(line) for line in log.read_text().splitlines()]
        return mine[0], sum(1 for step in steps if step.get("event") != "start")

    async def before_and_after() -> list[tuple[ResultMessage, int]]:
        await create_topics(broker.bootstrap, topics.layout())
        return [await serve_once("before", 0), await serve_once("after", 1)]

    (before, steps_before), (after, steps_after) = asyncio.run(before_and_after())
    assert steps_before > 0 and [row.cached for row in before.rows] == [False, False, False]
    assert [row.output for row in after.rows] == [row.output for row in before.rows]
    assert [row.key for row in after.rows] == ["France", "Japan", "France"]
    assert all(row.cached for row in after.rows) and steps_after == 0
