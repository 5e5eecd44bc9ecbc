"""`relstream-lab drill flood`: a hostile producer's flood while valid work streams through.

Bad messages of many kinds (`KINDS`: malformed bytes, wrong fields and types, bounds
broken, messages of several MB, one over any producer's 1 MiB request limit) go to the
rows and relqueries topics of a running worker and engine (real processes, sim backend),
interleaved with valid rows and relQueries. The drill then checks what docs/operations.md
promises: every valid relQuery answered, every bad message dead-lettered with a reason
(matched back to its kind by its key), both processes alive, and both processes' memory
bounded: each one's RSS is sampled every 0.1 s from after start-up (the baseline) to the
end, and its growth (peak minus baseline) must stay under `RSS_BOUND_MB`. Valid relQueries
of about 5 MB (`large`, `large_rows` rows each) go beside the bad ones.
`tests/lab/test_flood.py` runs a short one in `make test`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from relstream.kafka.clients.aio import (
    Subscription,
    new_producer,
    running,
)
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.launch import relstream_command, spawn_logged, start_worker, wait_ready
from relstream.wire import DeadLetterMessage, ResultMessage, decode

TABLE = "reviews"
QUERY = '[[query]]\nname = "flood"\ntable = "reviews"\ntemplate = "Rate: {review}"\n'
QUERY += "window_seconds = 0.5\nmax_rows = 20\nmax_output_tokens = 4\n"
BIG = 5_000_000  # bytes of the largest messages: five times any producer's default limit
HOSTILE_REQUEST_BYTES = 16 * 1024 * 1024  # the flood's own producer sends what it likes
RSS_BOUND_MB = {"engine": 300.0, "worker": 100.0}  # growth allowed over the baseline
RSS_EVERY_S = 0.1
pack = msgspec.msgpack.encode


def _row(key: str, values: object, **extra: object) -> dict:
    return {"version": 1, "table": TABLE, "key": key, "values": values, **extra}


def _relquery(key: str, **fields: object) -> dict:
    base = {
        "version": 1,
        "id": key,
        "template": "Rate: {review}",
        "rows": [{"key": "r", "values": {"review": "fine"}}],
        "max_output_tokens": 4,
        "submitted_at": time.time(),
    }
    return {**base, **fields}


@dataclass(frozen=True)
class Kind:
    """One kind of bad message: the topic it goes to and how to make the i-th one."""

    name: str
    topic: str  # "rows" or "relqueries"
    make: Callable[[str, random.Random], bytes]
    big: bool = False  # several MB: sent a few times, not in proportion


KINDS = (
    Kind("random bytes row", "rows", lambda k, r: r.randbytes(r.randint(1, 300))),
    Kind("empty row", "rows", lambda k, r: b""),
    Kind("row not a map", "rows", lambda k, r: pack([1, 2, 3])),
    Kind("row without version", "rows", lambda k, r: pack({"table": TABLE, "key": k})),
    Kind("row of version 99", "rows", lambda k, r: pack({**_row(k, {}), "version": 99})),
    Kind("row without key", "rows", lambda k, r: pack({"version": 1, "table": TABLE})),
    Kind("row values not a map", "rows", lambda k, r: pack(_row(k, "text"))),
    Kind("row value nested", "rows", lambda k, r: pack(_row(k, {"review": {"a": 1}}))),
    # An unknown field is read past (message evolution, docs/wire-format.md); a known one of
    # the wrong type is bad input.
    Kind(
        "row field of wrong type",
        "rows",
        lambda k, r: pack(_row(k, {"review": "x"}, produced_at="yesterday")),
    ),
    Kind("row lacks the column", "rows", lambda k, r: pack(_row(k, {"title": "x"}))),
    Kind(
        "row invalid UTF-8",
        "rows",
        lambda k, r: pack(_row(k, {"review": "x"})).replace(b"\xa1x", b"\xa1\xff"),
    ),
    Kind("row of 300 KB", "rows", lambda k, r: pack(_row(k, {"review": "x" * 300_000}))),
    Kind("row of 5 MB", "rows", lambda k, r: pack(_row(k, {"review": "x" * BIG})), big=True),
    Kind("relquery random bytes", "relqueries", lambda k, r: r.randbytes(r.randint(1, 300))),
    Kind(
        "relquery without version",
        "relqueries",
        lambda k, r: pack({n: v for n, v in _relquery(k).items() if n != "version"}),
    ),
    Kind("relquery without rows", "relqueries", lambda k, r: pack(_relquery(k, rows=[]))),
    Kind("relquery bad template", "relqueries", lambda k, r: pack(_relquery(k, template="{x.y}"))),
    Kind("relquery 0 tokens", "relqueries", lambda k, r: pack(_relquery(k, max_output_tokens=0))),
    Kind("relquery temperature 5", "relqueries", lambda k, r: pack(_relquery(k, temperature=5))),
    Kind(
        "relquery empty choices",
        "relqueries",
        lambda k, r: pack(_relquery(k, output={"choices": []})),
    ),
    Kind(
        "relquery bad regex", "relqueries", lambda k, r: pack(_relquery(k, output={"regex": "("}))
    ),
    Kind("relquery seed as text", "relqueries", lambda k, r: pack(_relquery(k, seed="seven"))),
    Kind(
        "relquery template 5 MB",
        "relqueries",
        lambda k, r: pack(_relquery(k, template="{review}" + "x" * BIG)),
        big=True,
    ),
    Kind(
        "relquery of 200,000 rows",
        "relqueries",
        lambda k, r: pack(
            _relquery(k, rows=[{"key": str(i), "values": {}} for i in range(200_000)])
        ),
        big=True,
    ),
)


@dataclass
class FloodReport:
    sent: Counter[str] = field(default_factory=Counter)  # kind -> bad messages sent
    lettered: Counter[str] = field(default_factory=Counter)  # kind -> dead letters found
    reasons: dict[str, str] = field(default_factory=dict)  # kind -> its first reason
    valid_sent: int = 0  # valid relQueries: ad-hoc ones and the worker's windows' rows
    valid_answered: int = 0
    rows_sent: int = 0
    rows_answered: int = 0
    alive: dict[str, bool] = field(default_factory=dict)  # process -> alive at the end
    rss_mb: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    # process -> RSS in MB: baseline after start-up, peak during the flood, at the end

    def rss_growth_mb(self, process: str) -> float:
        baseline, peak, _ = self.rss_mb.get(process, (0.0, 0.0, 0.0))
        return peak - baseline

    @property
    def holds(self) -> bool:
        return (
            self.lettered == self.sent
            and self.valid_answered == self.valid_sent
            and self.rows_answered == self.rows_sent
            and all(self.alive.values())
            and all(self.rss_growth_mb(name) < bound for name, bound in RSS_BOUND_MB.items())
        )


class RssSampler:
    """Each process's RSS, its children's included (the sim backend's simulating
    children), every `RSS_EVERY_S`, in a thread: baseline (at start), peak, last."""

    def __init__(self, pids: dict[str, int]) -> None:
        import psutil

        self._processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.mb = {name: (rss, rss, rss) for name, rss in self._sample().items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> dict[str, float]:
        import psutil

        sizes = {}
        for name, process in self._processes.items():
            with contextlib.suppress(psutil.Error):  # a process that exited keeps its peak
                family = [process, *process.children(recursive=True)]
                sizes[name] = sum(member.memory_info().rss for member in family) / 2**20
        return sizes

    def _run(self) -> None:
        while not self._stop.wait(RSS_EVERY_S):
            for name, rss in self._sample().items():
                baseline, peak, _ = self.mb[name]
                self.mb[name] = (baseline, max(peak, rss), rss)

    def stop(self) -> dict[str, tuple[float, float, float]]:
        self._stop.set()
        self._thread.join()
        return dict(self.mb)


def flood_messages(count: int, big_each: int, seed: int) -> list[tuple[Kind, str, bytes]]:
    """`count` bad messages over every kind, `big_each` of each big kind, shuffled."""
    rng = random.Random(seed)
    small = [kind for kind in KINDS if not kind.big]
    plan = [kind for kind in KINDS if kind.big for _ in range(big_each)]
    plan += [small[i % len(small)] for i in range(count - len(plan))]
    rng.shuffle(plan)
    return [
        (kind, f"bad|{kind.name}|{i}", kind.make(f"bad-{i}", rng)) for i, kind in enumerate(plan)
    ]


async def _produce(broker: EmbeddedBroker, topics: Topics, bad, valid_rows, valid_relqueries):
    """The flood, with a valid row or relQuery after every few bad messages."""
    producer = new_producer(broker.bootstrap, max_request_size=HOSTILE_REQUEST_BYTES)
    good = [(topics.rows(TABLE), key, value) for key, value in valid_rows]
    good += [(topics.relqueries, key, value) for key, value in valid_relqueries]
    every = max(1, len(bad) // max(1, len(good)))
    async with running(producer):
        for index, (kind, key, value) in enumerate(bad):
            topic = topics.rows(TABLE) if kind.topic == "rows" else topics.relqueries
            await producer.send(topic, value, key=key.encode())
            if index % every == 0 and good:
                topic, key, value = good.pop()
                await producer.send(topic, value, key=key.encode())
        for topic, key, value in good:
            await producer.send(topic, value, key=key.encode())
        await producer.flush()


def valid_work(
    relqueries: int, rows: int, large: int = 0, large_rows: int = 20_000
) -> tuple[list, list]:
    """Valid rows (for the worker's windows) and valid ad-hoc relQueries, as (key, bytes):
    `relqueries` of one row and `large` of `large_rows` rows and about 5 MB each."""
    good_rows = [(f"good-{i}", pack(_row(f"good-{i}", {"review": f"r{i}"}))) for i in range(rows)]
    adhoc = [(f"valid-{i}", pack(_relquery(f"valid-{i}"))) for i in range(relqueries)]
    pad = "x" * max(1, BIG // max(1, large_rows) - 40)
    for n in range(large):
        key = f"valid-large-{n}"
        table = [{"key": str(i), "values": {"review": f"{n}.{i} {pad}"}} for i in range(large_rows)]
        adhoc.append((key, pack(_relquery(key, rows=table))))
    return good_rows, adhoc


def run_flood(
    broker: EmbeddedBroker,
    workdir: Path,
    count: int,
    seed: int = 0,
    big_each: int = 2,
    valid_relqueries: int = 50,
    valid_rows: int = 200,
    timeout: float = 600.0,
    large: int = 0,
    large_rows: int = 20_000,
) -> FloodReport:
    """The drill on a started broker, with its own worker and engine (logs in `workdir`)."""
    topics = Topics(prefix=f"flood{seed}.")
    asyncio.run(create_topics(broker.bootstrap, topics.layout((TABLE,))))
    config = workdir / "queries.toml"
    config.write_text(QUERY)
    common = ["--bootstrap", broker.bootstrap, "--prefix", topics.prefix]
    engine = spawn_logged(
        [
            *relstream_command(False),
            "engine",
            "--backend",
            "sim",
            *common,
            "--broker-kind",
            broker.kind,
            "--ready-file",
            str(workdir / "engine.ready"),
        ],
        workdir / "engine.log",
    )
    worker = start_worker(
        relstream_command(True), broker, config, workdir / "worker.log", topics,
        ready_file=workdir / "worker.ready",
    )  # fmt: skip
    report = FloodReport()
    sampler = None
    try:
        ready_files = [workdir / "worker.ready", workdir / "engine.ready"]
        wait_ready(ready_files, (engine, worker), timeout)
        bad = flood_messages(count, big_each, seed)
        good_rows, adhoc = valid_work(valid_relqueries, valid_rows, large, large_rows)
        report.sent = Counter(kind.name for kind, _, _ in bad)
        report.valid_sent, report.rows_sent = len(adhoc), len(good_rows)
        time.sleep(2.0)  # both settle after start-up before the baseline
        sampler = RssSampler({"engine": engine.pid, "worker": worker.pid})
        asyncio.run(_produce(broker, topics, bad, good_rows, adhoc))
        asyncio.run(_collect(broker, topics, report, timeout))
    finally:
        if sampler is not None:
            report.rss_mb = sampler.stop()
        report.alive = {"engine": engine.poll() is None, "worker": worker.poll() is None}
        for process in (engine, worker):
            process.terminate()
        for process in (engine, worker):
            process.wait(30)
    return report


async def _collect(broker, topics: Topics, report: FloodReport, timeout: float) -> None:
    """Count dead letters and answers as they come, until every one expected is in or
    `timeout` has passed (then the report shows what was missing)."""
    rows: set[str] = set()
    answered: set[str] = set()

    def letter(record) -> bool:
        message = decode(DeadLetterMessage, record.value)
        kind = (message.key or b"").decode(errors="replace").split("|")[1:2]
        name = kind[0] if kind else f"not from the flood: {message.reason[:60]}"
        report.lettered[name] += 1
        report.reasons.setdefault(name, message.reason)
        return sum(report.lettered.values()) >= sum(report.sent.values())

    def result(record) -> bool:
        message = decode(ResultMessage, record.value)
        if message.id.startswith("valid-"):
            answered.add(message.id)
        rows.update(row.key for row in message.rows if row.key.startswith("good-"))
        report.valid_answered, report.rows_answered = len(answered), len(rows)
        return len(answered) == report.valid_sent and len(rows) == report.rows_sent

    await asyncio.gather(
        _read_until(broker, topics.deadletter, letter, timeout),
        _read_until(broker, topics.results, result, timeout),
    )


async def _read_until(broker, topic: str, done: Callable[[object], bool], timeout: float) -> None:
    subscription = Subscription(broker.bootstrap, topic, broker_kind=broker.kind, timeout=timeout)
    with contextlib.suppress(TimeoutError):
        async with subscription as messages:
            async for record in messages:
                if done(record):
                    return


def report_table(report: FloodReport) -> str:
    """The drill's outcome as a markdown table, one line per kind, then the totals."""
    lines = ["| kind | sent | dead-lettered | first reason |", "|---|---|---|---|"]
    for name in sorted(set(report.sent) | set(report.lettered)):
        reason = report.reasons.get(name, "—").replace("|", "/")[:90]
        lines.append(f"| {name} | {report.sent[name]} | {report.lettered[name]} | {reason} |")
    lines += [
        "",
        f"valid relQueries answered: {report.valid_answered}/{report.valid_sent}; valid rows "
        f"answered: {report.rows_answered}/{report.rows_sent}; alive at the end: "
        + ", ".join(f"{name} {'yes' if up else 'NO'}" for name, up in report.alive.items()),
        "",
        "| process | RSS baseline MB | peak MB | at the end MB | growth MB | bound MB |",
        "|---|---|---|---|---|---|",
    ]
    for name, (baseline, peak, last) in report.rss_mb.items():
        lines.append(
            f"| {name} | {baseline:.0f} | {peak:.0f} | {last:.0f} | "
            f"{report.rss_growth_mb(name):.0f} | < {RSS_BOUND_MB[name]:.0f} |"
        )
    return "\n".join(lines)
