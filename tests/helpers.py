"""Helpers shared by test modules (fixtures live in conftest.py): no test module imports
another."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from relstream import launch
from relstream.backend import EngineFailure
from relstream.connectors.sinks import JsonlSink
from relstream.kafka.clients.aio import read_messages
from relstream.kafka.tools.brokers import free_port
from relstream.model import RelQuery, Row, Template
from relstream.scheduler import EngineView
from relstream.scheduler.data import EngineLimits, SeqInfo
from relstream.scheduler.tracker import RequestTracker
from relstream.sim.backend import SimRelQueryBackend
from relstream.wire import ResultMessage, RowMessage, decode, encode, validate

REPO = Path(__file__).resolve().parents[1]


def relquery(index: int, size: int = 3) -> RelQuery:
    """The `index`th of a run of small relQueries, each under a fresh id."""
    rows = [Row(f"r{index}-{k}", {"city": f"city-{index}-{k}"}) for k in range(size)]
    return RelQuery(f"rq-{index}-{uuid.uuid4().hex[:6]}", Template("Describe {city}."), rows, 5)


def encode_row(row: dict) -> bytes:
    return encode(validate(RowMessage, row))


def stream_bin() -> Path:
    """The Faust worker environment's bin folder (RELSTREAM_STREAM_BIN)."""
    path = Path(os.environ.get("RELSTREAM_STREAM_BIN", REPO / ".venv-stream" / "bin"))
    if not (path / "relstream").exists():
        pytest.fail(f"no Faust environment at {path}: run `make setup`")
    return path


def start_worker(
    broker, topics, config: Path, log: Path, app_id: str | None = None, ready_file=None
) -> subprocess.Popen:
    """The worker in its Faust environment; a fresh app id (so consumer groups) unless
    given, as a restarted worker keeps its own."""
    executable = [str(stream_bin() / "relstream")]
    app_id = app_id or f"worker-{uuid.uuid4().hex[:8]}"
    return launch.start_worker(executable, broker, config, log, topics, app_id, ready_file)


def sink_results(broker, topics, sent: list[str], path: Path, wait_s: float, within_s: float):
    """Read the results topic into a JSONL sink at `path` until every id of `sent` is
    answered or `within_s` passed (each read waits up to `wait_s`); the ids answered."""
    sink = JsonlSink(path)
    answered: set[str] = set()
    wanted = len(sent)
    deadline = time.monotonic() + within_s
    while len(answered) < len(sent) and time.monotonic() < deadline:
        messages = asyncio.run(
            read_messages(broker.bootstrap, topics.results, wanted, broker.kind, wait_s)
        )
        for message in messages:
            result = decode(ResultMessage, message.value)
            sink.write(result)
            answered.add(result.id)
        wanted = len(messages) + 1
    sink.close()
    return answered


@contextlib.asynccontextmanager
async def http_server(app):
    """`app` (the HTTP door) served by uvicorn on a free port of 127.0.0.1, in this event
    loop, as `relstream serve` serves it: its port."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not (server.started or task.done()):
        await asyncio.sleep(0.05)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


async def post_and_leave(port: int, body: dict, leave_when, stream: bool = False) -> None:
    """POST `body` to the door's /v1/relqueries, then close the connection unanswered
    once the awaitable `leave_when` is done (the door holds it: `door_serving`, or it is
    on a topic): a client that goes away while it is served, however fast the door."""
    _reader, writer = await asyncio.open_connection("127.0.0.1", port)
    data = json.dumps(body).encode()
    path = "/v1/relqueries?stream=true" if stream else "/v1/relqueries"
    head = f"POST {path} HTTP/1.1\r\nhost: door\r\ncontent-type: application/json\r\n"
    writer.write(f"{head}content-length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    try:
        await leave_when
    finally:
        writer.close()
        await writer.wait_closed()


async def door_serving(door, count: int = 1, within_s: float = 30.0) -> None:
    """Until the door's /health counts at least `count` relQueries handed to its engine
    and not yet answered. `door`: an httpx.AsyncClient on the door, or its port on
    127.0.0.1."""
    import httpx

    if isinstance(door, int):
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{door}") as client:
            return await door_serving(client, count, within_s)
    await until(lambda: _serving(door, count), within_s, f"{count} relQueries served at the door")


async def _serving(client, count: int) -> bool:
    return (await client.get("/health")).json().get("serving", 0) >= count


def wait_until(condition, within_s: float, what: str, every_s: float = 0.2):
    """Poll `condition()` until it returns something true, which is returned; an
    AssertionError naming `what` once `within_s` passed. A test waits so on what a
    broker, a worker or an engine does, never on the clock: the deadline is generous,
    as it costs nothing where the thing happens sooner."""
    deadline = time.monotonic() + within_s
    while not (found := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {within_s:g} s")
        time.sleep(every_s)
    return found


async def until(condition, within_s: float, what: str, every_s: float = 0.05):
    """`wait_until` on an event loop; `condition()` may return an awaitable."""
    deadline = time.monotonic() + within_s
    while True:
        found = condition()
        if inspect.isawaitable(found):
            found = await found
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {within_s:g} s")
        await asyncio.sleep(every_s)


def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offset on each partition of `topic` it has one on."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        offsets = admin.list_group_offsets(group).get(group, {})
        return {p.partition: o.offset for p, o in offsets.items() if p.topic == topic}
    finally:
        admin.close()


def group_members(bootstrap: str, group: str) -> list[str]:
    """The members of `group` as the broker describes them (Tansu's answer included:
    `kafka.tools.groups.group_members`); [] where it describes none."""
    from kafka import KafkaAdminClient

    from relstream.kafka.tools.groups import group_members as described

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return described(admin, [group]).get(group, [])
    finally:
        admin.close()


def assigned_members(bootstrap: str, group: str) -> int:
    """Members of `group` the broker describes with partitions assigned (0 where it
    describes none, or cannot be asked yet)."""
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        members = admin.describe_groups([group]).get(group, {}).get("members", [])
    except Exception:  # not yet known to the broker, or a broker that does not describe
        return 0
    finally:
        admin.close()
    assigned = [(m.get("member_assignment") or {}).get("assigned_partitions", []) for m in members]
    return sum(any(topic["partitions"] for topic in held) for held in assigned)


class FaultyBackend(SimRelQueryBackend):
    """The simulated backend with faults chosen by relQuery id: serving a "poison-" one
    raises a plain error, serving a "dies-" one fails the engine."""

    async def submit(self, relquery):
        if relquery.id.startswith("poison-"):
            raise RuntimeError(f"cannot serve {relquery.id}")
        if relquery.id.startswith("dies-"):
            raise EngineFailure("the engine core died")
        return await super().submit(relquery)


class UnencodableBackend(SimRelQueryBackend):
    """The simulated backend, but an "unencodable-" relQuery's rows carry a value no
    encoder takes (a backend's bug the service does not foresee)."""

    async def submit(self, relquery):
        handle = await super().submit(relquery)
        if relquery.id.startswith("unencodable-"):
            result = handle.result

            async def unencodable():
                answered = await result()
                rows = [dataclasses.replace(row, value=object()) for row in answered.rows]
                return dataclasses.replace(answered, rows=rows)

            handle.result = unencodable
        return handle


def faulty_backend(_options) -> FaultyBackend:
    """`FaultyBackend` as `relstream engine --backend` starts a registered backend."""
    return FaultyBackend()


def entry_point_folder(folder: Path, group: str, name: str, target: str) -> Path:
    """`folder` holding a dist-info that declares the entry point `name = target` in
    `group`, as installing a package writes it: put `folder` on a process's path."""
    info = folder / f"relstream_test_{name}-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: relstream-test-{name}\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {target}\n")
    return folder


class ScriptedView(EngineView):
    """An EngineView whose prefix cache and clock the test sets by hand."""

    def __init__(self, limits: EngineLimits, now: float = 0.0) -> None:
        self.tracker = RequestTracker()
        self.limits = limits
        self.clock = now
        self.cached: dict[str, int] = {}
        self.free_tokens = 10**9

    def now(self) -> float:
        return self.clock

    def cached_prompt_tokens(self, seq: SeqInfo) -> int:
        return self.cached.get(seq.request_id, 0)

    def free_kv_tokens(self) -> int:
        return self.free_tokens

    def add_relquery(
        self,
        relquery_id: str,
        prompts: list[int],
        max_tokens: int,
        arrival: float = 0.0,
        deadline: float | None = None,
        shares: dict[int, str] | None = None,
        priority: int = 0,
        query: str = "",
    ) -> list[str]:
        """`shares`: row -> the key it shares with identical requests (`SeqInfo.share`)."""
        ids = []
        for row, prompt in enumerate(prompts):
            seq = SeqInfo(
                f"{relquery_id}#{row}", relquery_id, prompt, max_tokens, arrival,
                deadline=deadline, priority=priority, query=query,
            )  # fmt: skip
            seq.share = (shares or {}).get(row)
            self.tracker.add_request(seq, len(prompts))
            ids.append(seq.request_id)
        return ids

    def start(self, request_id: str) -> None:
        """Mark a request prefilled, as an engine would after its prefill step."""
        seq = self.tracker.start(request_id)
        self.tracker.record_progress(seq, computed=seq.prompt_tokens, generated=1)


class CachingBackend:
    """A backend with the real engine's identical-request sharing and answer cache
    (`relstream.engine.twins`, `relstream.engine.answers`), without vLLM: a row's prompt
    tokens are its prompt's bytes and its answer is `computed: <prompt>`. `computed`
    counts the rows it ran."""

    model_name = "fake"
    policy = "fcfs"

    def __init__(self, identity: str = "ab" * 32, model: str = "org/fake-model") -> None:
        from relstream.engine.answers import AnswerCache
        from relstream.engine.twins import SharedRequests

        self.answer_cache = AnswerCache(1 << 20, model, identity)
        self._shared = SharedRequests(self.answer_cache)
        self.computed = 0

    def backlog_rows(self) -> int:
        return 10_000

    def load(self) -> None:
        """It does not price its work: it reports no load."""

    def shutdown(self) -> None:
        """Nothing to release."""

    @staticmethod
    def key(relquery, index: int, identity: str = "ab" * 32):
        """The request key of `relquery`'s row `index` on a backend of `identity`."""
        from relstream.engine.answers import request_key
        from relstream.model import prepare_row

        prompt = prepare_row(relquery, index).prompt
        return request_key(relquery, list(prompt.encode()), identity)

    async def submit(self, relquery):
        import asyncio

        from relstream.sim.backend import SimHandle

        outcome = asyncio.ensure_future(self._serve(relquery))
        return SimHandle(relquery, outcome, self.policy)

    async def _serve(self, relquery):
        from relstream.engine.answers import SharedOutcome
        from relstream.engine.requests import answered_row
        from relstream.model import RelQueryResult, prepare_row

        rows = []
        for index in range(len(relquery.rows)):
            request = prepare_row(relquery, index)
            role = self._shared.role(self.key(relquery, index, self.answer_cache.identity))
            if role.cached is not None:
                rows.append(answered_row(relquery, request, role.cached, True))
                continue
            self.computed += 1
            answer = SharedOutcome(f"computed: {request.prompt}", 1)
            self._shared.settle(role, answer)
            rows.append(answered_row(relquery, request, answer))
        return RelQueryResult(relquery.id, rows, None, self.policy, self.model_name)


async def read_all(bootstrap: str, topic: str, isolation: str, idle_s: float = 3.0) -> list:
    """Every message of `topic` a reader of `isolation` sees (to 3 s of silence)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        isolation_level=isolation,
        group_id=None,
    )
    await consumer.start()
    seen = []
    try:
        while batches := await consumer.getmany(timeout_ms=int(idle_s * 1000)):
            for messages in batches.values():
                seen.extend(messages)
    finally:
        await consumer.stop()
    return seen


async def step_logged(step_log: Path, logged, timeout_s: float = 120.0) -> dict:
    """The first step in the plug-in's step log (written a line per step as it runs) for
    which `logged(step)` holds: the test then acts on what the engine has done, not on a
    clock, so it means the same on a faster or a slower machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = step_log.read_text() if step_log.exists() else ""
        for line in text[: text.rfind("\n") + 1].splitlines():  # whole lines only
            step = json.loads(line)
            if "kind" in step and logged(step):
                return step
        assert time.monotonic() < deadline, f"no such step in {timeout_s} s: {text[-2000:]}"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def zombie_and_owner(bootstrap: str, group: str, partition, zombie: dict, owner: dict):
    """Two processes' producers for one input partition (`PartitionProducers` with the
    options given each) and a consumer each, assigned it: (zombie, owner, consumers), all
    stopped on leaving. Which takes the partition over when is the test's to say."""
    from relstream.kafka.clients.aio import new_consumer
    from relstream.kafka.delivery.transactions import PartitionProducers

    producers = [PartitionProducers(bootstrap, group, stall_s=60.0, **options)
                 for options in (zombie, owner)]  # fmt: skip
    consumers = [new_consumer(bootstrap, group_id=group) for _ in range(2)]
    for consumer in consumers:
        await consumer.start()
        consumer.assign([partition])
    try:
        yield producers[0], producers[1], consumers
    finally:
        for consumer in consumers:
            await consumer.stop()
        for producers_of in producers:
            await producers_of.close_all()
