"""The Faust worker (`relstream worker`): rows topics → windows → the relqueries topic.

One agent per registration takes rows in batches of up to `max_rows`, waiting at most
`window_seconds` for a batch: a tumbling window that also closes early on a row cap.
Valid rows of a batch become one relQuery; rows that cannot be used go to the dead-letter
topic with the reason. The batch's offsets are committed by Faust once the agent asks for
the next batch, i.e. after the relQuery was produced (at-least-once). Runs in its own
environment (`relstream[stream]`), since faust-streaming and vLLM pin conflicting clicks.
"""

from __future__ import annotations

import faust

from relstream.kafka.clients import client_settings
from relstream.kafka.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.topics import Topics
from relstream.schemas import encode
from relstream.schemas.convert import dead_letter_message
from relstream.stream.registrations import QueryRegistration
from relstream.stream.windowing import RowRejection, check_row, relquery_for_window


def build_app(
    bootstrap: str,
    registrations: list[QueryRegistration],
    topics: Topics | None = None,
    app_id: str = "relstream-worker",
    broker_kind: str | None = None,
    security: KafkaSecurity = PLAINTEXT,
) -> faust.App:
    topics = topics or Topics()
    # Faust spells the consumer's session settings in seconds.
    kafka_settings = client_settings(broker_kind)
    settings = {
        f"broker_{name.removesuffix('_ms')}": value / 1000 for name, value in kafka_settings.items()
    }
    app = faust.App(
        app_id,
        broker=f"kafka://{bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=topics.partitions,
        topic_allow_declare=False,  # topics are created with explicit partition counts
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        store="memory://",
        broker_credentials=security.faust_credentials(),
        **settings,
    )
    relqueries = app.topic(topics.relqueries, key_type=bytes, value_type=bytes)
    deadletter = app.topic(topics.deadletter, key_type=bytes, value_type=bytes)
    for registration in registrations:
        rows_topic = app.topic(topics.rows(registration.table), key_type=bytes, value_type=bytes)
        app.agent(rows_topic, name=f"window-{registration.name}")(
            _window_agent(registration, relqueries, deadletter)
        )
    return app


def _window_agent(registration: QueryRegistration, relqueries, deadletter):
    async def agent(stream):
        async for events in stream.take_events(
            registration.max_rows, within=registration.window_seconds
        ):
            rows = []
            for event in events:
                checked = check_row(registration, event.value)
                if isinstance(checked, RowRejection):
                    await deadletter.send(key=event.key, value=_dead_letter(event, checked.reason))
                else:
                    rows.append(checked)
            if rows:
                first = events[0].message
                window_id = f"{first.partition}-{first.offset}"
                message = relquery_for_window(registration, rows, window_id)
                await relqueries.send(key=message.id.encode(), value=encode(message))

    return agent


def _dead_letter(event, reason: str) -> bytes:
    message = event.message
    return encode(
        dead_letter_message(event.value, message.topic, message.partition, message.offset, reason)
    )
