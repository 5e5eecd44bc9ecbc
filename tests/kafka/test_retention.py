"""The embedded broker keeps relstream's topics for a stated time (issue 49, item 1):
noida-db writes its whole store after any write, so a store that only grows costs more
every day. Rows, relQueries, results and dead letters are kept `keep_days`; metrics (load
reports among them) and partial results a day at most."""

import asyncio

from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from relstream.kafka.clients.aio import new_admin
from relstream.kafka.clients.topics import Topics
from relstream.kafka.tools.brokers import DEFAULT_BROKER, EmbeddedBroker


async def retention(bootstrap: str, topic: str) -> str | None:
    admin = new_admin(bootstrap)
    await admin.start()
    try:
        (response,) = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, topic, None)]
        )
    finally:
        await admin.close()
    entries = [entry for resource in response.resources for entry in resource[4]]
    return next((entry[1] for entry in entries if entry[0] == "retention.ms"), None)


def test_the_embedded_broker_creates_its_topics_with_a_retention(tmp_path):
    topics = Topics()
    broker = EmbeddedBroker(DEFAULT_BROKER, data_dir=tmp_path, tables=("reviews",), keep_days=2)
    broker.start()
    try:
        kept = {
            topic: asyncio.run(retention(broker.bootstrap, topic))
            for topic in (topics.rows("reviews"), topics.results, topics.metrics)
        }
    finally:
        broker.stop()
    two_days, a_day = str(2 * 86_400_000), str(86_400_000)
    assert kept == {topics.rows("reviews"): two_days, topics.results: two_days,
                    topics.metrics: a_day}  # fmt: skip
