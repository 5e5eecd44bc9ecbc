"""kafka-python clients, for callers that are not asyncio programs (`relstream.client`,
`relstream status`): made here, like every aiokafka client in `clients`, so the security
settings and the bootstrap timeout reach each one."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from relstream.kafka.security import PLAINTEXT, KafkaSecurity

# Give up on an address where no broker answers after this, not kafka-python's default
# 30 s: a user hears of it within 10 s.
BOOTSTRAP_TIMEOUT_MS = 6_000


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
    """A kafka-python consumer that reads only committed messages (`clients.new_consumer`)."""
    options = {"isolation_level": "read_committed", **options}
    return _connected("KafkaConsumer", bootstrap, security, *topics, **options)


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
