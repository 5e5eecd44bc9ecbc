"""Engine processes as a user runs them (`relstream engine` on the simulated backend),
and what a test can watch of them from outside: the metrics topic and /metrics."""

import asyncio
import collections
import sys
import time

from relstream.kafka.clients.aio import Subscription
from relstream.launch import spawn_logged
from relstream.wire import MetricsMessage, decode
from relstream.wire.formats import is_load_report


def engine_process(
    broker, topics, group, log, budget_rows: int = 12, metrics_port=None, extra=(), scale="1.0",
    ready_file=None, verb="engine",
):  # fmt: skip
    """`relstream engine --backend sim` (or `serve`, its HTTP door's options in `extra`);
    it writes `ready_file` (if given) once it serves (`launch.wait_ready`)."""
    command = [
        sys.executable,
        "-m",
        "relstream",
        verb,
        "--backend",
        "sim",
        "--sim-time-scale",
        scale,
        "--bootstrap",
        broker.bootstrap,
        "--prefix",
        topics.prefix,
        "--group",
        group,
        "--broker-kind",
        broker.kind,
        "--max-backlog-rows",
        str(budget_rows),
    ]
    if metrics_port:
        command += ["--metrics-port", str(metrics_port)]
    if ready_file:
        command += ["--ready-file", str(ready_file)]
    return spawn_logged([*command, *extra], log)


def answers_by(broker, topics) -> collections.Counter:
    """How often each engine process id answered each relQuery: (pid, relQuery id) ->
    count, from the metrics topic (one message per answer)."""

    async def read() -> collections.Counter:
        # To its end: until 2 s pass without an answer. Engines write load reports there
        # too, four a second, so the topic itself is never idle while one runs.
        subscription = Subscription(
            broker.bootstrap, topics.metrics, broker_kind=broker.kind, idle_seconds=2, timeout=60
        )
        answers, last = [], time.monotonic()
        async with subscription as messages:
            async for m in messages:
                if not is_load_report(m.headers):
                    answers.append(decode(MetricsMessage, m.value))
                    last = time.monotonic()
                elif time.monotonic() - last >= 2:
                    break
        return collections.Counter(
            (int(answer.engine.rsplit(":", 1)[1]), answer.relquery_id) for answer in answers
        )

    return asyncio.run(read())


async def keys_written(broker, topic) -> collections.Counter:
    """How often each key was written to `topic` (read to its end)."""
    subscription = Subscription(
        broker.bootstrap, topic, broker_kind=broker.kind, idle_seconds=3, timeout=60
    )
    async with subscription as messages:
        return collections.Counter([m.key.decode() async for m in messages])


def served_by(broker, topics) -> collections.Counter:
    """relQueries served so far by each engine process id (from the metrics topic)."""
    served: collections.Counter = collections.Counter()
    for (pid, _), count in answers_by(broker, topics).items():
        served[pid] += count
    return served


def wait_for(condition, seconds: float = 90.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.5)
    return False


def scrape(port: int) -> dict[str, float]:
    """Prometheus samples without labels (summed over labels) from the /metrics page."""
    from urllib.error import URLError
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    try:
        page = urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except URLError:
        return {}
    totals: dict[str, float] = collections.defaultdict(float)
    for family in text_string_to_metric_families(page):
        for sample in family.samples:
            totals[sample.name] += sample.value
    return totals
