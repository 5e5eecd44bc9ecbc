"""An engine's load reports, written and signed: looked at every LOAD_REPORT_S seconds,
the relqueries partitions it owns now (its consumer's assignment) and its backend's
`load()` (`placement/load.py`), published on the metrics topic at every look while it
has work (a busy report is trusted for `EXPIRY_S` only), and once idle only when that
changes or every LOAD_HEARTBEAT_S as a heartbeat, so relQueries can be placed by load
(`placement/book.py` reads them). The default broker rewrites its whole store after any
write, so an idle pipeline's cost hangs on these (issue 49).

A report is best effort: one the broker does not take is dropped, and the next one
replaces it. A reader trusts each for a few seconds only, so an engine
that dies or leaves stops being chosen by itself. Reports carry the header
`relstream-kind: load_report`, so readers of the metrics messages can tell them apart.
Where the engines share a secret (`config.answer_secret`, else `RELSTREAM_ANSWER_SECRET`)
each report is signed with it, and readers with that secret take only signed ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import socket
import time
from collections.abc import AsyncIterator, Callable

import msgspec

from relstream.kafka.clients.supervise import supervised
from relstream.kafka.delivery.publish import publish_best_effort
from relstream.placement.choice import EngineLoad
from relstream.placement.load import Load
from relstream.wire import LoadReportMessage, encode
from relstream.wire.messages import KIND_HEADER

LOAD_REPORT_S = 0.25  # how often an engine looks at its load (docs/benchmarks/placement)
LOAD_HEARTBEAT_S = 300.0  # an unchanged report is repeated this often (`IDLE_EXPIRY_S`)
HEADERS = [(KIND_HEADER, LoadReportMessage.kind.encode())]
SECRET_ENV = "RELSTREAM_ANSWER_SECRET"  # the engines' secret (service/answercache.py)
MAC_CONTEXT = b"relstream.load_report.v1\0"
# The engine's load now (its backend's `load`), None while it cannot tell: placement is
# given the function, not the backend, so it never imports the layer below it.
LoadNow = Callable[[], Load | None]


def engines_secret() -> bytes | None:
    """The engines' secret from `RELSTREAM_ANSWER_SECRET`, or None where it is not set."""
    return os.environ.get(SECRET_ENV, "").encode() or None


def report_mac(secret: bytes, report: LoadReportMessage) -> bytes:
    """HMAC-SHA256 over the report's message without its MAC."""
    unsigned = encode(msgspec.structs.replace(report, mac=None))
    return hmac.new(secret, MAC_CONTEXT + unsigned, hashlib.sha256).digest()


def signed(report: LoadReportMessage, secret: bytes | None) -> LoadReportMessage:
    """The report signed with `secret`; unchanged without one."""
    if not secret:
        return report
    return msgspec.structs.replace(report, mac=report_mac(secret, report))


def address(host: str, port: int) -> str:
    """host:port as another process reaches it (a wildcard host: this machine's name)."""
    host = socket.gethostname() if host in ("", "0.0.0.0", "::") else host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextlib.asynccontextmanager
async def listening(host: str, metrics_port: int | None) -> AsyncIterator[str]:
    """A port this engine listens on while it reports, named in its reports so that
    `relstream status` tells a killed engine (the connection refused) from an idle one,
    which reports only every few minutes: its metrics endpoint where it serves one, else
    a port of its own that accepts and hangs up."""
    if metrics_port:
        yield address(host, metrics_port)
        return
    server = await asyncio.start_server(_hang_up, host, 0)
    try:
        yield address(host, server.sockets[0].getsockname()[1])
    finally:
        server.close()


async def _hang_up(_reader, writer) -> None:
    writer.close()


def engine_load(report: LoadReportMessage) -> EngineLoad:
    """A report as the placer keeps it: its `Load` read back field by field."""
    fields = {name: getattr(report, name) for name in Load.__struct_fields__}
    return EngineLoad(report.engine, tuple(report.partitions), msgspec.convert(fields, Load),
                      report.at)  # fmt: skip


def load_report(
    load_now: LoadNow, consumer, topic: str, engine: str, listens: str | None = None
):
    """The engine's report now, or None where its backend cannot tell its load yet
    (`load_now()`, the backend's `load`, returns None), or
    tells one that is not finite. `listens`: a port the engine listens on while it runs
    (`listening`). The report carries each field of `Load` under its name (the wire's
    form of the one type, `placement/load.py`)."""
    load = load_now()
    if load is None:
        return None
    owned = sorted(p.partition for p in consumer.assignment() if p.topic == topic)
    fields = {
        name: list(value) if isinstance(value, tuple) else value
        for name, value in msgspec.structs.asdict(load).items()
    }
    report = LoadReportMessage(
        engine=engine, topic=topic, partitions=owned, at=time.time(), listens=listens, **fields
    )
    return report if report.finite else None


async def report_load(load_now: LoadNow, consumer, producer, config, engine: str) -> None:
    """Publish the engine's report every `config.load_report_s` seconds until cancelled
    (`config`: the service's, naming its topics); nothing where that is 0. Restarted
    (logged, with backoff) if it dies."""
    if config.load_report_s > 0:
        run = lambda: _report_load(load_now, consumer, producer, config, engine)  # noqa: E731
        await supervised("the load reporter", run)


def due(report: LoadReportMessage, last: LoadReportMessage | None, heartbeat_s: float) -> bool:
    """Whether `report` is to be published: the engine has work (a reader trusts a busy
    report seconds only), or it differs from the `last` published (its time aside), or
    that one is `heartbeat_s` old."""
    busy = report.outstanding_s > 0 or any(report.size_counts)
    if busy or last is None or report.at - last.at >= heartbeat_s:
        return True
    return msgspec.structs.replace(report, at=last.at) != last


async def _report_load(load_now: LoadNow, consumer, producer, config, engine: str):
    topics = config.topics
    secret = config.answer_secret or engines_secret()
    last = None
    async with listening(config.metrics_host, config.metrics_port) as listens:
        while True:
            report = load_report(load_now, consumer, topics.relqueries, engine, listens)
            if report is not None and due(report, last, config.load_heartbeat_s):
                value = encode(signed(report, secret))
                await publish_best_effort(producer, topics.metrics, value, engine.encode(),
                                          HEADERS)  # fmt: skip
                last = report
            await asyncio.sleep(config.load_report_s)
