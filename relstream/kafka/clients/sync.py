"""kafka-python clients, for callers that are not asyncio programs (`relstream.client`,
`relstream status`): made here, like every aiokafka client in `clients`, so the security
settings and the bootstrap timeout reach each one."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity

# Give up on an address where no broker answers after this, not kafka-python's default
# 30 s: a user hears of it within 10 s.
BOOTSTRAP_TIMEOUT_MS = 6_000
SILENT_S = 5.0  # a reader's broker unreachable this long is said once (`BrokerWatch`)

log = logging.getLogger("relstream.client")


class BrokerUnavailable(ConnectionError):
    """No Kafka broker answered at the client's bootstrap address."""


def _connected(kind: str, bootstrap: str, security: KafkaSecurity, *args: Any, **options: Any):
    """A kafka-python client of `kind`, or BrokerUnavailable naming the address (instead of
    kafka-python's traceback) when no broker answers there in time."""
    import kafka
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    try:
        return getattr(kafka, kind)(
            *args,
            bootstrap_servers=bootstrap,
            bootstrap_timeout_ms=BOOTSTRAP_TIMEOUT_MS,
            **security.client_options(),
            **options,
        )
    except (KafkaConnectionError, KafkaTimeoutError) as exc:
        raise BrokerUnavailable(
            f"no Kafka broker answered at {bootstrap} within "
            f"{BOOTSTRAP_TIMEOUT_MS / 1000:g} s ({type(exc).__name__}). Is one running "
            "there? `relstream broker` starts one."
        ) from None


def sync_producer(bootstrap: str, security: KafkaSecurity = PLAINTEXT, **options: Any):
    return _connected("KafkaProducer", bootstrap, security, **options)


def sync_consumer(
    bootstrap: str, *topics: str, security: KafkaSecurity = PLAINTEXT, **options: Any
):
    """A kafka-python consumer that reads only committed messages (`clients.new_consumer`),
    and says when its broker stops answering and answers again (`BrokerWatch`)."""
    options = {"isolation_level": "read_committed", **options}
    consumer = _connected("KafkaConsumer", bootstrap, security, *topics, **options)
    watch, poll = BrokerWatch(consumer, bootstrap), consumer.poll

    def watched(*args: Any, **kwargs: Any):
        batches = poll(*args, **kwargs)
        watch()
        return batches

    consumer.poll = watched
    return consumer


class BrokerWatch:
    """Whether a reader still reaches a broker, checked after each poll: it says once when
    none has answered for `silent_s` and once when one answers again, so a reader that
    follows (`results --follow`, a sink) is not silent through an outage, which looks
    like having nothing to read. kafka-python retries by itself meanwhile."""

    def __init__(self, consumer, bootstrap: str, silent_s: float = SILENT_S) -> None:
        self._client = consumer._client
        self._bootstrap = bootstrap
        self._silent_s = silent_s
        self._since: float | None = None  # when it was last found unreachable first
        self._said = False

    def __call__(self) -> None:
        brokers = [_node(broker) for broker in self._client.cluster.brokers()]
        now = time.monotonic()
        if any(self._client.connected(node) for node in brokers):
            if self._said:
                log.warning("the broker at %s answers again (silent %.0f s); reading on",
                            self._bootstrap, now - self._since)  # fmt: skip
            self._since, self._said = None, False
        elif self._since is None:
            self._since = now
        elif not self._said and now - self._since >= self._silent_s:
            self._said = True
            log.warning("the broker at %s does not answer; still waiting, nothing is lost: "
                        "reading resumes when it is back", self._bootstrap)  # fmt: skip


def sync_admin(bootstrap: str, security: KafkaSecurity = PLAINTEXT, **options: Any):
    return _connected("KafkaAdminClient", bootstrap, security, **options)


class AckedPrefix:
    """Which of a run of sends (numbered from 0) the broker acknowledged, and how many
    from the first are all acknowledged: acknowledgements come back out of order across
    partitions, and a run resumed after that many sends no row twice."""

    def __init__(self) -> None:
        self._done: set[int] = set()
        self.prefix = 0
        self._lock = threading.Lock()  # the producer's sender thread calls `add`

    def add(self, index: int) -> None:
        with self._lock:
            self._done.add(index)
            while self.prefix in self._done:
                self._done.discard(self.prefix)
                self.prefix += 1

    def prefix_after(self, producer, wait_s: float) -> int:
        """`prefix` once `producer` has sent what it holds, or `wait_s` passed."""
        if wait_s > 0:
            with contextlib.suppress(Exception):  # what did not arrive is not counted
                producer.flush(timeout=wait_s)
        return self.prefix


def _node(broker) -> int:
    """A broker's node id: `node_id` in kafka-python 2.1, `nodeId` before."""
    return broker.node_id if hasattr(broker, "node_id") else broker.nodeId
