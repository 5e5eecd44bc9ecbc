"""`relstream status`: a pipeline at a glance, from its broker alone."""

from __future__ import annotations

import time

import click
from rich.table import Table

from relstream.cli.common import bootstrap_option, console, prefix_option, security_options
from relstream.kafka.security import KafkaSecurity


@click.command()
@bootstrap_option
@prefix_option
@security_options
def status(bootstrap: str, prefix: str, security: KafkaSecurity) -> None:
    """Topics and their sizes, each consumer group's lag (worker, engines, sinks), the
    engines seen answering, and the dead letters by reason."""
    from relstream.kafka.inspect import TAIL_MESSAGES, pipeline_status
    from relstream.kafka.topics import Topics

    found = pipeline_status(bootstrap, Topics(prefix), security)
    if not found.topics:
        raise click.ClickException(
            f"no topic under {prefix!r} at {bootstrap}: is this the pipeline's broker and "
            "prefix? `relstream broker` and the worker create them"
        )
    topics = Table("topic", "partitions", "messages", title=f"topics at {bootstrap}")
    for topic in found.topics:
        topics.add_row(topic.name, str(topic.partitions), str(topic.messages))
    groups = Table("group", "stage", "members", "lag by topic", title="consumer groups")
    for group in found.groups:
        members = "?" if group.members is None else str(group.members)
        lag = ", ".join(f"{name} {count}" for name, count in sorted(group.lag.items()))
        groups.add_row(group.group, group.stage, members, lag)
    console.print(topics, groups)
    now = time.time()
    for engine in found.engines:
        console.print(
            f"engine {engine.name}: {engine.answered} relQueries answered, the last "
            f"{now - engine.last_answer_at:.0f} s ago",
            markup=False,
        )
    if not found.engines:
        console.print("no engine has answered a relQuery yet")
    letters = sum(found.dead_letters.values())
    reasons = "".join(f"; {n} {reason}" for reason, n in found.dead_letters.most_common())
    console.print(f"{letters} dead letters (the newest {TAIL_MESSAGES:,} read){reasons}")
