"""What the drills that run a pipeline through faults share: the query they register, a
producer of rows at a steady seeded rate, the broker's Kafka side stopped and started on
its data dir, the engine's command line and a reader loop."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from pathlib import Path

import msgspec

from relstream.kafka.clients.aio import Subscription, new_producer
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream.launch import relstream_command

TABLE = "reviews"
WORDS = ("good", "bad", "fine", "broken", "great", "slow", "quick", "cheap", "lovely", "awful")
pack = msgspec.msgpack.encode


def query_config(name: str) -> str:
    """One query over `TABLE`: windows of half a second or 20 rows, four output tokens."""
    return (
        f'[[query]]\nname = "{name}"\ntable = "{TABLE}"\ntemplate = "Rate: {{review}}"\n'
        "window_seconds = 0.5\nmax_rows = 20\nmax_output_tokens = 4\n"
    )


def engine_command(
    broker: EmbeddedBroker, topics: Topics, ready_file: Path, *extra: str
) -> list[str]:
    """`relstream engine` on the sim backend in real time (`--sim-time-scale 1`), so it is
    serving when a fault comes, writing `ready_file` once it takes work."""
    return [
        *relstream_command(False), "engine", "--backend", "sim", "--sim-time-scale", "1",
        "--bootstrap", broker.bootstrap, "--prefix", topics.prefix,
        "--broker-kind", broker.kind, "--ready-file", str(ready_file), *extra,
    ]  # fmt: skip


def absent(keys: set[str], counts: Counter[str]) -> set[str]:
    """The keys never counted (rows in no stored result, say)."""
    return {key for key in keys if counts[key] == 0}


def repeated(counts: Counter[str]) -> set[str]:
    """The keys counted more than once."""
    return {key for key, count in counts.items() if count > 1}


class Rows:
    """Rows produced at a steady rate (exponential gaps, seeded), each sent until the
    broker acknowledges it; one in `bad_every` lacks the template's column."""

    def __init__(self, broker: EmbeddedBroker, topic: str, rng: random.Random, bad_every: int):
        # Patient: a row waits out an outage in the producer. Idempotent where the broker
        # gives producer ids (Tansu refuses InitProducerId; it is never stopped mid-drill).
        self.producer = new_producer(
            broker.bootstrap,
            enable_idempotence=broker.kind != "tansu",
            request_timeout_ms=600_000,
        )
        self.topic, self.rng, self.bad_every = topic, rng, bad_every
        self.sent = 0
        self.acked: set[str] = set()
        self.bad_acked: set[str] = set()
        self.pending: set[asyncio.Task] = set()

    def _row(self) -> tuple[str, bytes, bool]:
        index = self.sent
        self.sent += 1
        bad = self.bad_every > 0 and index % self.bad_every == self.bad_every - 1
        key = f"{'bad' if bad else 'row'}-{index}"
        text = " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(3, 30)))
        values = {"title": text} if bad else {"review": text}
        return key, pack({"version": 1, "table": TABLE, "key": key, "values": values}), bad

    async def _send(self, key: str, value: bytes, bad: bool) -> None:
        while True:
            try:
                await (await self.producer.send(self.topic, value, key=key.encode()))
                break
            except Exception:  # any failure: the row is sent again
                await asyncio.sleep(1.0)
        (self.bad_acked if bad else self.acked).add(key)

    def emit(self, count: int = 1) -> None:
        for _ in range(count):
            task = asyncio.create_task(self._send(*self._row()))
            self.pending.add(task)
            task.add_done_callback(self.pending.discard)

    async def stream(self, rate: float, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.emit()
            await asyncio.sleep(self.rng.expovariate(rate))

    async def settle(self, timeout: float) -> None:
        """Until the broker has acknowledged every row sent (TimeoutError after `timeout`)."""
        async with asyncio.timeout(timeout):
            while self.pending:
                await asyncio.wait(self.pending)


async def stop_kafka(broker: EmbeddedBroker) -> None:
    """Stop the broker (SIGTERM: Kafka's controlled shutdown), its data kept."""
    await asyncio.to_thread(broker.stop)


async def start_kafka(broker: EmbeddedBroker, timeout: float = 60.0) -> None:
    """Start the broker again on the same port and data; returns once it answers."""
    await asyncio.to_thread(broker.start, timeout)



async def read_all(subscription: Subscription, handle) -> None:
    """`handle` each message of the subscription until it ends (or its task is cancelled)."""
    with contextlib.suppress(TimeoutError):
        async for record in subscription:
            handle(record)
