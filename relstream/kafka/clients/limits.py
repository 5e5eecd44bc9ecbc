"""The largest message a topic takes, asked of the broker: what the worker cuts its windows
under (`stream.windowing`), so that no relQuery it makes is refused for its size.

A topic's `max.message.bytes` (Kafka's per-topic setting, which a topic inherits from the
broker's `message.max.bytes`), else the broker's `message.max.bytes`, and never more than
a relstream producer's request limit (`clients.MAX_REQUEST_BYTES`). A broker that answers
neither (Tansu answers DescribeConfigs with no entries), or cannot be asked, gets the
request limit, which is also Kafka's default.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from relstream.kafka.clients.aio import MAX_REQUEST_BYTES, new_admin
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity

log = logging.getLogger("relstream.kafka")

ASK_S = 10.0  # how long the broker is asked before the request limit is taken


async def message_limit(
    bootstrap: str, topic: str, security: KafkaSecurity = PLAINTEXT, timeout_s: float = ASK_S
) -> int:
    """The largest message relstream sends to `topic` (module doc)."""
    admin = new_admin(bootstrap, security, request_timeout_ms=int(timeout_s * 1000))
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            told = await _config(admin, ConfigResourceType.TOPIC, topic, "max.message.bytes")
            if told is None:
                node = (await admin.describe_cluster())["brokers"][0]["node_id"]
                told = await _config(
                    admin, ConfigResourceType.BROKER, str(node), "message.max.bytes"
                )
    except (TimeoutError, KafkaError, OSError) as exc:
        log.warning(
            "could not ask the broker for %s's message limit (%s); taking %d bytes",
            topic,
            type(exc).__name__,
            MAX_REQUEST_BYTES,
        )
        return MAX_REQUEST_BYTES
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
    return MAX_REQUEST_BYTES if told is None else min(told, MAX_REQUEST_BYTES)


async def _config(admin, kind: ConfigResourceType, name: str, key: str) -> int | None:
    """The integer setting `key` of a topic or broker, None if it is not told. Every entry
    is asked for (None): Tansu closes the connection on a request that names entries."""
    (response,) = await admin.describe_configs([ConfigResource(kind, name, None)])
    for resource in response.resources:
        error_code, entries = resource[0], resource[4]
        if error_code:
            return None
        for entry in entries:
            if entry[0] == key and entry[1] is not None and entry[1].lstrip("-").isdigit():
                value = int(entry[1])
                return value if value > 0 else None
    return None
