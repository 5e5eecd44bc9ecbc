"""The answer cache backed by the compacted answers topic (`--answer-cache topic`): what
one engine computes, another one (or the same one restarted) answers from the topic
without running the model; only signed answers of the engine's own model identity are
taken, tombstones and later answers are honoured, and `relstream answers purge` drops
them all. On a real broker of each kind, and on the real engine."""

import asyncio
import json
import time
import uuid

import msgpack
import pytest
from helpers import CachingBackend

from relstream.engine.answers import AnswerCache, SharedOutcome
from relstream.kafka.clients.aio import (
    new_admin,
    new_producer,
    read_messages,
    start_all,
)
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.model import RelQuery, Row, Template
from relstream.service.answercache import (
    TOPIC_CONFIG,
    AnswerSecretError,
    AnswerTopic,
    answer_secret,
    purge_answers,
    signed_answer,
)
from relstream.wire import ResultMessage, decode, encode
from relstream.wire.convert import relquery_message

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
IDENTITY = "ab" * 32  # the model's identity digest (engine.identity.ModelIdentity)
SECRET = b"the engines' shared secret"


def digest(n: int) -> bytes:
    return n.to_bytes(32, "big")  # any 32 bytes: the topic keeps what the cache gives it


def topic_reader(broker, topic, cache, producer, secret=SECRET) -> AnswerTopic:
    return AnswerTopic(broker.bootstrap, topic, cache, producer, broker.kind, secret=secret)


def test_answers_one_engine_publishes_fill_the_cache_of_the_next(broker):
    topic = Topics(prefix=f"a{uuid.uuid4().hex[:6]}.").answers

    async def scenario():
        producer = new_producer(broker.bootstrap)
        await start_all(producer)
        try:
            first = AnswerCache(1 << 20, MODEL, IDENTITY)
            writer = topic_reader(broker, topic, first, producer)
            await writer.start()
            for n in range(3):
                first.remember(digest(n), SharedOutcome(f"answer {n}", n + 1))
            first.put(digest(9), SharedOutcome("read from elsewhere", 1))  # not published again
            # Another model's answer on the same topic, signed: never loaded by this one.
            other = signed_answer(SECRET, digest(7), "someorg/other", "cd" * 32, "no", 1)
            await producer.send_and_wait(topic, encode(other), key=digest(7))
            await writer.stop()
            # A second engine (or this one restarted), its cache 2 entries large.
            entry = AnswerCache.entry_bytes(digest(0), SharedOutcome("answer 0", 1))
            second = AnswerCache(2 * entry, MODEL, IDENTITY)
            reader = topic_reader(broker, topic, second, producer)
            await reader.start()
            await reader.stop()
            return writer.published, reader, second
        finally:
            await producer.stop()

    published, reader, cache = asyncio.run(scenario())
    assert published == 3 and reader.loaded == 3 and reader.other_identity == 1
    assert reader.rejected == {}
    assert cache.bytes <= cache.max_bytes
    assert cache.get(digest(0)) is None  # the oldest went: the cap holds while loading
    assert cache.get(digest(2)) == SharedOutcome("answer 2", 3) and cache.get(digest(7)) is None


def forgeries(key: bytes, genuine: bytes) -> list[bytes]:
    """What someone who can write the topic but lacks the secret can produce for `key`: a
    genuine answer's MAC under another text, an answer of the previous release (version 1,
    unsigned), and a version 2 one without a MAC."""
    fields = msgpack.unpackb(genuine)
    return [
        msgpack.packb({**fields, "text": "No"}),
        msgpack.packb({"version": 1, "model": "fake", "text": "No", "output_tokens": 1}),
        msgpack.packb({k: v for k, v in {**fields, "text": "No"}.items() if k != "mac"}),
    ]


@pytest.mark.slow
def test_an_engine_never_serves_a_forged_or_unsigned_answer_and_honours_tombstones(broker):
    from relstream.service.service import KafkaService, ServiceConfig

    topics = Topics(prefix=f"f{uuid.uuid4().hex[:6]}.")
    template = Template("Is {x} a city?")

    def relquery(name: str) -> RelQuery:
        return RelQuery(name, template, [Row("r", {"x": "Paris"})], max_output_tokens=4)

    key = CachingBackend.key(relquery("q"), 0).digest
    backend = CachingBackend()

    async def scenario():
        await create_topics(broker.bootstrap, topics.layout())
        # made as the engine makes it: the forger writes before any engine ran
        await create_topics(broker.bootstrap, {topics.answers: 1}, configs=TOPIC_CONFIG)
        producer = new_producer(broker.bootstrap)
        await start_all(producer)
        # A genuine answer of another key, whose MAC a forger reuses under this key.
        genuine = signed_answer(SECRET, digest(1), MODEL, IDENTITY, "Yes", 1)
        for value in forgeries(key, encode(genuine)):
            await producer.send_and_wait(topics.answers, value, key=key)
        config = ServiceConfig(
            broker.bootstrap, topics, group_id=f"e-{uuid.uuid4().hex}", broker=broker.kind,
            answer_topic=True, answer_secret=SECRET,
        )  # fmt: skip
        service = KafkaService(config, backend)
        stop = asyncio.Event()
        running = asyncio.create_task(service.run(stop))
        results: list[ResultMessage] = []

        async def ask(name: str) -> ResultMessage:
            message = encode(relquery_message(relquery(name)))
            await producer.send_and_wait(topics.relqueries, message, key=name.encode())
            raw = await read_messages(
                broker.bootstrap, topics.results, len(results) + 1, broker.kind, 60
            )
            results[:] = [decode(ResultMessage, m.value) for m in raw]
            return next(r for r in results if r.id == name)

        async def until(condition) -> None:
            deadline = time.monotonic() + 30
            while not condition() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert condition()

        first = await ask("first")  # computed: the forgeries were not taken
        again = await ask("again")  # from the cache
        await producer.send_and_wait(topics.answers, None, key=key)  # a tombstone
        await until(lambda: key not in backend.answer_cache)
        after_tombstone = await ask("after-tombstone")  # computed again
        # A later signed answer (another engine's) replaces the one held.
        later = signed_answer(SECRET, key, MODEL, IDENTITY, "computed: Is Paris a city? (2)", 1)
        await producer.send_and_wait(topics.answers, encode(later), key=key)
        await until(lambda: backend.answer_cache.get(key).text.endswith("(2)"))
        replaced = await ask("replaced")
        stop.set()
        await running
        await producer.stop()
        rejected = {
            reason: service.metrics.registry.get_sample_value(
                "relstream_answers_rejected_total", {"reason": reason}
            )
            for reason in ("forged", "unsigned")
        }
        return first, again, after_tombstone, replaced, rejected

    first, again, after_tombstone, replaced, rejected = asyncio.run(scenario())
    computed = "computed: Is Paris a city?"
    assert [(r.rows[0].output, r.rows[0].cached) for r in (first, again, after_tombstone)] == [
        (computed, False),
        (computed, True),
        (computed, False),
    ]
    assert (replaced.rows[0].output, replaced.rows[0].cached) == (computed + " (2)", True)
    assert backend.computed == 2
    assert rejected == {"forged": 1.0, "unsigned": 2.0}


def test_purge_tombstones_every_answer_also_in_a_running_engine(broker):
    topic = Topics(prefix=f"p{uuid.uuid4().hex[:6]}.").answers

    async def scenario():
        producer = new_producer(broker.bootstrap)
        await start_all(producer)
        try:
            running = AnswerCache(1 << 20, MODEL, IDENTITY)
            engine = topic_reader(broker, topic, running, producer)
            await engine.start()
            following = asyncio.create_task(engine.follow())
            for n in range(3):
                running.remember(digest(n), SharedOutcome(f"answer {n}", 1))
            await asyncio.gather(*engine._sending)
            purged = await purge_answers(broker.bootstrap, topic, broker.kind)
            deadline = time.monotonic() + 30
            while len(running) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
            await engine.stop()
            restarted = AnswerCache(1 << 20, MODEL, IDENTITY)
            reader = topic_reader(broker, topic, restarted, producer)
            await reader.start()
            await reader.stop()
            again = await purge_answers(broker.bootstrap, topic, broker.kind)
            configs = await topic_configs(broker.bootstrap, topic)
            return (purged, len(running), engine.removed, len(restarted), again), configs
        finally:
            await producer.stop()

    counts, configs = asyncio.run(scenario())
    assert counts == (3, 0, 3, 0, 0)
    # Compacted, and bounded in time and size (docs/serving.md: the answers topic).
    assert {name: configs.get(name) for name in TOPIC_CONFIG} == TOPIC_CONFIG


async def topic_configs(bootstrap: str, topic: str) -> dict[str, str]:
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = new_admin(bootstrap)
    await admin.start()
    try:
        found = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    finally:
        await admin.close()
    return {entry[0]: entry[1] for entry in found[0].resources[0][4]}


def test_purge_asks_for_confirmation():
    from click.testing import CliRunner

    from relstream.cli import main

    result = CliRunner().invoke(main, ["answers", "purge", "--bootstrap", "localhost:1"])
    assert result.exit_code == 2 and "relstream.answers" in result.output
    assert "--yes" in result.output


def test_the_topic_cache_refuses_to_start_without_a_shared_secret(tmp_path, monkeypatch):
    monkeypatch.delenv("RELSTREAM_ANSWER_SECRET", raising=False)
    with pytest.raises(AnswerSecretError, match="--answer-secret-file PATH or set RELSTREAM"):
        answer_secret()
    with pytest.raises(AnswerSecretError, match="under 16 bytes"):
        (tmp_path / "short").write_text("short\n")
        answer_secret(tmp_path / "short")
    (tmp_path / "secret").write_text("a secret of the engines\n")
    assert answer_secret(tmp_path / "secret") == b"a secret of the engines"
    monkeypatch.setenv("RELSTREAM_ANSWER_SECRET", "another secret, from the environment")
    assert answer_secret() == b"another secret, from the environment"
    with pytest.raises(AnswerSecretError, match="--answer-secret-file"):
        AnswerTopic("localhost:1", "t", AnswerCache(1, MODEL, IDENTITY), None, secret=None)
    from click.testing import CliRunner

    from relstream.cli import main

    monkeypatch.delenv("RELSTREAM_ANSWER_SECRET")
    args = ["engine", "--bootstrap", "localhost:1", "--backend", "sim", "--answer-cache", "topic"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "--answer-secret-file PATH" in result.output


@pytest.mark.vllm
@pytest.mark.slow
def test_a_restarted_engine_answers_a_repeated_row_from_the_topic_without_the_model(
    broker, tmp_path
):
    if broker.kind == "kafka":
        pytest.skip("the engine's part is broker-blind; the topic is tested on both above")
    from relstream.engine.runtime import EngineSettings, VllmRuntime
    from relstream.service.service import KafkaService, ServiceConfig

    topics = Topics(prefix=f"r{uuid.uuid4().hex[:6]}.")
    group = f"e-{uuid.uuid4().hex}"  # the restarted engine's too: it takes only new work
    rows = [Row(c, {"country": c}) for c in ("France", "Japan", "France")]
    template = Template("What is the capital of {country}? Answer with the city name only.")

    async def serve_once(name: str, results_so_far: int) -> tuple[ResultMessage, int, dict]:
        """A fresh engine and service answer one relQuery; returns its result, the steps
        the engine ran and the answers it rejected, by reason."""
        relquery = RelQuery(name, template, rows, max_output_tokens=8)
        log = tmp_path / f"{name}.jsonl"
        settings = EngineSettings(step_log=log, answer_cache_bytes=1 << 20)
        engine = await VllmRuntime.start(settings)
        config = ServiceConfig(
            broker.bootstrap, topics, group_id=group, broker=broker.kind, answer_topic=True,
            answer_secret=SECRET,
        )  # fmt: skip
        stop = asyncio.Event()
        serving = KafkaService(config, engine)
        service = asyncio.create_task(serving.run(stop))
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
        rejected = {
            reason: serving.metrics.registry.get_sample_value(
                "relstream_answers_rejected_total", {"reason": reason}
            )
            for reason in ("forged", "unsigned")
        }
        return mine[0], sum(1 for step in steps if step.get("event") != "start"), rejected

    async def forge() -> int:
        """Under each key the engine published, a forgery (a genuine MAC, another text)
        and an unsigned answer, after the genuine one: the restarted engine must keep
        serving the genuine answers."""
        published = await read_messages(broker.bootstrap, topics.answers, 2, broker.kind, 60)
        producer = new_producer(broker.bootstrap)
        await start_all(producer)
        for message in published:
            for value in forgeries(message.key, message.value):
                await producer.send_and_wait(topics.answers, value, key=message.key)
        await producer.stop()
        return len(published)

    async def before_and_after():
        await create_topics(broker.bootstrap, topics.layout())
        before = await serve_once("before", 0)
        return before, await forge(), await serve_once("after", 1)

    (before, steps_before, _), forged, (after, steps_after, rejected) = asyncio.run(
        before_and_after()
    )
    assert forged == 2 and rejected == {"forged": 2.0, "unsigned": 4.0}
    assert steps_before > 0 and [row.cached for row in before.rows] == [False, False, False]
    assert [row.output for row in after.rows] == [row.output for row in before.rows]
    assert [row.key for row in after.rows] == ["France", "Japan", "France"]
    assert all(row.cached for row in after.rows) and steps_after == 0
