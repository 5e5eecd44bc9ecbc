"""`relstream status`: a pipeline at a glance, from its broker alone."""

from __future__ import annotations

import time

import click
from rich.table import Table

from relstream.cli.common import (
    bootstrap_option,
    console,
    prefix_option,
    security_options,
    stop_signals,
)
from relstream.kafka.clients.security import KafkaSecurity


@click.command()
@bootstrap_option
@prefix_option
@security_options
@click.option(
    "--watch",
    type=click.FloatRange(1.0),
    is_flag=False,
    flag_value=5.0,
    default=None,
    metavar="[SECONDS]",
    help="Redraw every SECONDS (5 if not given) until Ctrl-C.",
)
def status(bootstrap: str, prefix: str, security: KafkaSecurity, watch: float | None) -> None:
    """Topics and their sizes, each consumer group's lag (worker, engines, sinks), the
    engines seen answering (those whose load reports stopped marked stale), partitions an
    open transaction holds, and the dead letters by cause. Joins no consumer group and
    answers within 10 s, on a live pipeline too."""
    from relstream.kafka.clients.topics import Topics
    from relstream.kafka.tools.inspect import pipeline_status

    names = Topics(prefix)
    if watch is None:
        show(pipeline_status(bootstrap, names, security), bootstrap, names)
        return
    with stop_signals() as stop:
        while not stop():
            found = pipeline_status(bootstrap, names, security)
            console.clear()
            show(found, bootstrap, names)
            console.print(f"every {watch:g} s; Ctrl-C ends", style="dim")
            deadline = time.monotonic() + watch
            while not stop() and time.monotonic() < deadline:
                time.sleep(0.1)


def show(found, bootstrap: str, names) -> None:
    from relstream.kafka.tools.groups import COUNTED
    from relstream.kafka.tools.inspect import STALE_REPORT_S, TAIL_MESSAGES
    from relstream.placement.choice import IDLE_EXPIRY_S

    if not found.topics:
        raise click.ClickException(
            f"no topic under {names.prefix!r} at {bootstrap}: is this the pipeline's broker "
            "and prefix? `relstream broker` and the worker create them"
        )
    topics = Table(
        "topic",
        "partitions",
        "replicas",
        "messages",
        title=f"topics at {bootstrap}",
        caption="records a reader finds (transaction markers not counted); ≤: offsets, "
        f"where a partition holds over {COUNTED:,} or was not read in time",
    )
    for topic in found.topics:
        replicas = "?" if topic.replication is None else str(topic.replication)
        messages = f"{'' if topic.counted else '≤'}{topic.messages}"
        topics.add_row(topic.name, str(topic.partitions), replicas, messages)
    console.print(topics)
    for topic in found.topics:
        if topic.under_replicated:
            numbers = ", ".join(map(str, topic.under_replicated))
            console.print(
                f"{topic.name}: partitions {numbers} under-replicated (fewer replicas in "
                "sync than assigned): a broker is down or behind",
                markup=False,
            )
    if found.groups:
        groups = Table(
            "group",
            "stage",
            "members",
            "lag by topic",
            title="consumer groups",
            caption="lag: records after the committed offsets (markers not counted)",
        )
        for group in found.groups:
            members = "not told" if group.members is None else str(group.members)
            lag = ", ".join(f"{name} {count}" for name, count in sorted(group.lag.items()))
            groups.add_row(group.group, group.stage, members, lag)
        console.print(groups)
        if any(group.members is None for group in found.groups):
            console.print("members not told: the broker did not describe the group")
    else:
        console.print("no consumer group has committed offsets on these topics")
    for held in found.held:
        console.print(
            f"{held.topic}[{held.partition}] is held by an open transaction from offset "
            f"{held.since} ({held.offsets} offsets behind it): read_committed readers wait "
            "there. Its writer died mid-transaction, or is slow to commit: start the engine "
            "or worker that owned the partition again (the same --instance-id aborts it); "
            "a broker that times transactions out aborts it after transaction.timeout.ms",
            markup=False,
        )
    newest = f" (in the newest {TAIL_MESSAGES:,} %s per partition)"
    metrics_cut = newest % "metrics" if names.metrics in found.cut else ""
    now = time.time()
    for engine in found.engines:
        said = f"engine {engine.name}: {engine.answered} relQueries answered{metrics_cut}"
        if engine.last_answer_at is not None:
            said += f", the last {now - engine.last_answer_at:.0f} s ago"
        if engine.reported_at is not None:
            silent = max(now - engine.reported_at, 0)
            idle = (engine.outstanding_s or 0.0) <= 0  # its report repeated as a heartbeat
            if engine.listening is False:
                said += (
                    f"; STALE: nothing listens at {engine.listens}, where it said it does"
                    f" (stopped, or killed; last load report {silent:.0f} s ago)"
                )
            elif silent > (IDLE_EXPIRY_S if idle else STALE_REPORT_S):
                said += (
                    f"; STALE: no load report for {silent:.0f} s (stopped, or killed:"
                    " a killed engine's partitions wait for it to start again)"
                )
            else:
                said += (
                    f"; {engine.outstanding_s:.1f} s of work outstanding (reported"
                    f" {silent:.0f} s ago)"
                )
        console.print(said, markup=False)
    if not found.engines:
        console.print("no engine has answered a relQuery yet")
    letters = found.dead_letters
    letters_cut = newest % "dead letters" if names.deadletter in found.cut else ""
    console.print(f"{letters.total()} dead letters{letters_cut}")
    for line in letters.lines():
        console.print(f"  {line}", markup=False)
    if found.unread:
        console.print(
            f"not read to the end in time (counts are partial): {', '.join(found.unread)}",
            markup=False,
        )
