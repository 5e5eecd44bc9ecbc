"""An engine's load reports: every LOAD_REPORT_S seconds, on the metrics topic, the
relqueries partitions it owns now (its consumer's assignment) and its outstanding work
and prices (its backend's `load()`), so relQueries can be placed by load
(`relstream.placer`).

A report is best effort: one the broker does not take is dropped, and the next one
replaces it. A reader trusts each for a few seconds only, so an engine
that dies or leaves stops being chosen by itself. Reports carry the header
`relstream-kind: load_report`, so readers of the metrics messages can tell them apart.
Where the engines share a secret (`config.answer_secret`, else `RELSTREAM_ANSWER_SECRET`)
each report is signed with it, and readers with that secret take only signed ones.
"""

from __future__ import annotations

import asyncio
import time

from relstream.backend import RelQueryBackend
from relstream.kafka.delivery import publish_best_effort
from relstream.kafka.supervise import supervised
from relstream.placer import engines_secret, signed
from relstream.schemas import LoadReportMessage, encode
from relstream.schemas.messages import KIND_HEADER

LOAD_REPORT_S = 0.25  # how often an engine reports, by default (docs/benchmarks/placement)
HEADERS = [(KIND_HEADER, LoadReportMessage.kind.encode())]


def load_report(backend: RelQueryBackend, consumer, topic: str, engine: str):
    """The engine's report now, or None where its backend cannot tell its load yet (or at
    all: a backend without `load`), or tells one that is not finite."""
    load = backend.load() if hasattr(backend, "load") else None
    if load is None:
        return None
    owned = sorted(p.partition for p in consumer.assignment() if p.topic == topic)
    report = LoadReportMessage(
        engine=engine,
        topic=topic,
        partitions=owned,
        outstanding_s=load.outstanding_s,
        per_prompt_token_s=load.per_prompt_token_s,
        per_output_token_s=load.per_output_token_s,
        templates=list(load.templates),
        size_counts=list(load.size_counts),
        at=time.time(),
    )
    return report if report.finite else None


async def report_load(backend: RelQueryBackend, consumer, producer, config, engine: str) -> None:
    """Publish the engine's report every `config.load_report_s` seconds until cancelled
    (`config`: the service's, naming its topics); nothing where that is 0. Restarted
    (logged, with backoff) if it dies."""
    if config.load_report_s > 0:
        run = lambda: _report_load(backend, consumer, producer, config, engine)  # noqa: E731
        await supervised("the load reporter", run)


async def _report_load(backend: RelQueryBackend, consumer, producer, config, engine: str):
    topics = config.topics
    secret = config.answer_secret or engines_secret()
    while True:
        report = load_report(backend, consumer, topics.relqueries, engine)
        if report is not None:
            value = encode(signed(report, secret))
            await publish_best_effort(producer, topics.metrics, value, engine.encode(), HEADERS)
        await asyncio.sleep(config.load_report_s)
