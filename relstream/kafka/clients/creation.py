"""Topics made as relstream makes them: explicit partition counts, the cluster's own
replication unless `Topics` says otherwise, refusals raised naming the topic, and a return
only once the brokers' metadata shows them led (a client started next finds them)."""

from __future__ import annotations

import asyncio
import time

from aiokafka.errors import KafkaError

from relstream.kafka.clients.aio import new_admin
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity


async def create_topics(
    bootstrap: str,
    layout: dict[str, int],
    security: KafkaSecurity = PLAINTEXT,
    configs: dict[str, str] | None = None,
    *,
    replication: int = -1,
    min_insync: int = 0,
) -> set[str]:
    """Create missing topics with explicit partition counts and topic `configs` (existing
    ones are kept as they are). `replication` -1 takes the cluster's
    `default.replication.factor`; `min_insync` 0 its `min.insync.replicas`
    (`Topics.replication`, `Topics.min_insync`). Returns the topics that existed before;
    a topic the broker refuses raises `TopicsRefused` naming it and why."""
    from aiokafka.admin import NewTopic

    admin = new_admin(bootstrap, security, request_timeout_ms=10_000)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = {name: count for name, count in layout.items() if name not in existing}
        if wanted:
            factor = replication if replication > 0 else await cluster_replication(admin)
            own = dict(configs or {})
            if min_insync > 0:
                own["min.insync.replicas"] = str(min_insync)
            deadline, left = time.monotonic() + CREATED_VISIBLE_S, dict(wanted)
            while left:  # a broker still starting refuses for a while, retriably
                asked = [NewTopic(name, n, factor, topic_configs=own) for name, n in left.items()]
                response = await admin.create_topics(asked)
                retry = _check_created(response, time.monotonic() < deadline)
                left = {name: left[name] for name in retry}
                if left:
                    await asyncio.sleep(0.5)
            await _until_led(admin, list(wanted))
    finally:
        await admin.close()
    return existing


# How long a created topic may take to show in the brokers' metadata with a leader for
# every partition (Kafka answers CreateTopics before its brokers all know the topic).
CREATED_VISIBLE_S = 15.0


async def _until_led(admin, names: list[str]) -> None:
    """Return once every topic of `names` has a leader for each partition in metadata, so
    a client started next finds it (at most `CREATED_VISIBLE_S`, then it returns anyway)."""
    deadline = time.monotonic() + CREATED_VISIBLE_S
    while time.monotonic() < deadline:
        described = await admin.describe_topics(names)
        led = [
            topic for topic in described
            if not topic["error_code"] and topic["partitions"]
            and all(part["leader"] >= 0 for part in topic["partitions"])
        ]  # fmt: skip
        if len(led) == len(names):
            return
        await asyncio.sleep(0.05)


class TopicsRefused(RuntimeError):
    """The broker refused to create a topic; the message names it and the broker's reason."""


# TOPIC_ALREADY_EXISTS: made meanwhile by another process, which is what was wanted.
_ALREADY_EXISTS = 36


def _check_created(response, may_retry: bool) -> list[str]:
    """The topics to ask for again (refused for a reason Kafka calls retriable, while
    `may_retry`); raises `TopicsRefused` naming any other refusal."""
    from aiokafka.errors import for_code

    refused, retry = [], []
    for topic, code, *rest in response.topic_errors:
        if code in (0, _ALREADY_EXISTS):
            continue
        if may_retry and getattr(for_code(code), "retriable", False):
            retry.append(topic)
            continue
        message = rest[0] if rest and isinstance(rest[0], str) else ""
        refused.append(f"{topic} (error {code}{': ' + message if message else ''})")
    if refused:
        raise TopicsRefused("the broker refused to create " + ", ".join(refused))
    return retry


async def cluster_replication(admin) -> int:
    """The cluster's `default.replication.factor`, read from a broker's configuration; a
    broker that does not say (Tansu) gets 1 per broker, at most 3."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    brokers = sorted(broker["node_id"] for broker in (await admin.describe_cluster())["brokers"])
    try:
        [response] = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.BROKER, str(brokers[0]))]
        )
        for _code, _message, _type, _name, entries in response.resources:
            for name, value, *_ in entries:
                if name == "default.replication.factor" and value:
                    # as the cluster says, never capped by the brokers up now: with one
                    # down, Kafka refuses it (named), not a topic silently less replicated
                    return max(1, int(value))
    except (KafkaError, ValueError, IndexError, TypeError):
        pass
    return max(1, min(3, len(brokers)))
