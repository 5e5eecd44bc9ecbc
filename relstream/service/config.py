"""What an engine service is told (`relstream engine`/`serve` build it from their options):
its broker, topics and group, its bounds, and what it publishes besides results."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.topics import Topics
from relstream.kafka.delivery.publish import STALL_S
from relstream.placement.reports import LOAD_HEARTBEAT_S
from relstream.service.backlog import DEFAULT_MAX_BACKLOG_ROWS
from relstream.wire.formats import Format


@dataclass
class ServiceConfig:
    bootstrap: str
    topics: Topics = field(default_factory=Topics)
    group_id: str = "relstream-engine"
    broker: str | None = None  # embedded broker kind, for its client settings
    max_backlog_rows: int = DEFAULT_MAX_BACKLOG_ROWS  # cap on rows handed to the engine
    max_held_rows: int = 0  # cap on rows held, large relQueries whole; 0: budget + 100,000
    max_attempts: int = 3  # tries of one relQuery before it is dead-lettered
    retry_backoff_s: float = 1.0  # wait before the second try, doubled after each
    partial_results: bool = False
    result_format: Format = "msgpack"  # for relQueries that set no `result_format`
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    ready_file: str | os.PathLike | None = None  # written once it takes work (`ready`)
    security: KafkaSecurity = PLAINTEXT  # TLS and SASL for both clients
    answer_topic: bool = False  # back the backend's answer cache with the answers topic
    answer_secret: bytes | None = None  # the engines' shared secret, signing answers
    stall_s: float = STALL_S  # a result unacknowledged this long pauses its partition
    load_report_s: float = 0.0  # > 0: look at its load this often (placement/reports.py)
    load_heartbeat_s: float = LOAD_HEARTBEAT_S  # an unchanged report repeated this often
    instance_id: str | None = None  # its static member id in the group (None: dynamic)
    transactions: bool = True  # exactly once where the broker has them (service/commits.py)
