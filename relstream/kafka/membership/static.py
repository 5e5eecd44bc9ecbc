"""Static group membership: a process restarted with the same command rejoins its groups
as the member it replaces, and one that stops on purpose leaves them.

A restarted consumer would otherwise wait for the group to expire the member it replaces
(a session timeout), then for a rebalance of every member. With a group instance id
(Kafka's static membership, KIP-345) the restarted consumer *is* that member and takes
its partitions back at once, and the others keep theirs. Each process therefore
needs an id that is the same across a restart and distinct from every other process in
the group:

- `--instance-id` or $RELSTREAM_INSTANCE_ID, where the operator names it;
- else `<hostname>-<n>`, with n the lowest slot free on this host for this broker and
  group: slot n is a file under the user's state dir that the process holds an flock on
  for as long as it is a member. The kernel drops the lock when the process dies, so a
  restart takes the slot of the one that died, and two processes started with the same
  command hold two slots. Containers differ by hostname.

Static members do not leave their group when they stop (aiokafka sends no LeaveGroup for
them), so their partitions would stay with a member that is gone: `stop_leaving` leaves
on a graceful stop. Tansu expires members by their session and is run without static
membership (docs/architecture/delivery.md, "Brokers").
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import platformdirs

from relstream.kafka.clients.aio import start_all

if TYPE_CHECKING:
    from aiokafka import TopicPartition

INSTANCE_ID_ENV = "RELSTREAM_INSTANCE_ID"
SAY_WAITING_AFTER_S = 10.0  # how long a process waits for its group before it says so


class MemberSlot:
    """This process's group instance id in one group, and the lock that keeps its slot."""

    def __init__(self, instance_id: str | None, lock: int | None = None) -> None:
        self.instance_id = instance_id  # None: a dynamic member (Tansu)
        self._lock = lock

    def release(self) -> None:
        """Give the slot up (the process stops being a member)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def slots_dir() -> Path:
    return Path(platformdirs.user_state_dir("relstream")) / "members"


def member_slot(
    bootstrap: str,
    group: str,
    broker_kind: str | None = None,
    explicit: str | None = None,
    folder: Path | None = None,
) -> MemberSlot:
    """This process's instance id in `group` on the broker at `bootstrap` (module doc):
    `explicit` (or $RELSTREAM_INSTANCE_ID) if set, else `<hostname>-<lowest free slot>`."""
    if broker_kind == "tansu":
        return MemberSlot(None)
    explicit = explicit or os.environ.get(INSTANCE_ID_ENV) or None
    if explicit:
        return MemberSlot(explicit)
    digest = hashlib.sha256(f"{bootstrap}\0{group}".encode()).hexdigest()[:16]
    name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', group)[:64]}-{digest}"
    try:
        (folder := (folder or slots_dir()) / name).mkdir(parents=True, exist_ok=True)
    except OSError:  # no writable state dir (a container's read-only home): the temp dir
        folder = Path(tempfile.gettempdir()) / f"relstream-members-{os.getuid()}" / name
        folder.mkdir(parents=True, exist_ok=True)
    slot = 0
    while True:
        lock = os.open(folder / f"{slot}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            slot += 1
            continue
        return MemberSlot(f"{socket.gethostname()}-{slot}", lock)


async def stop_leaving(consumer) -> None:
    """Stop `consumer`, leaving its group even as a static member, so that its partitions
    go to the other members at once. aiokafka leaves (LeaveGroup by member id, which
    Tansu and Kafka accept for a static member too) only for a dynamic member,
    so it is told this one is dynamic now: nothing after the stop needs the instance id."""
    coordinator = getattr(consumer, "_coordinator", None)
    if coordinator is not None and getattr(coordinator, "_group_instance_id", None):
        coordinator._group_instance_id = None
    await consumer.stop()


def close_leaving(consumer, timeout_ms: int) -> None:
    """`stop_leaving` for a kafka-python consumer (the sinks'): a reader that ends leaves
    its group, so `relstream status` does not count it and its partitions move at once.
    Killed, it stays a static member, and the same reader run again takes them back."""
    config = getattr(getattr(consumer, "_coordinator", None), "config", None)
    if isinstance(config, dict) and config.get("group_instance_id"):
        config["group_instance_id"] = None  # what `group_instance_id` reads
    consumer.close(timeout_ms=timeout_ms)


STOP_S = 5.0  # how long an abandoned start may take to stop its clients


async def start_waiting(
    stop: asyncio.Event | None,
    logger: logging.Logger,
    bootstrap: str,
    *clients,
    after_s: float = SAY_WAITING_AFTER_S,
) -> bool:
    """`start_all(*clients)`, the last a subscribed consumer, whose start waits until its
    group has given it partitions (for good where a dead member holds them), unless `stop`
    is set first: then the start is abandoned (its clients get `STOP_S` to stop) and False
    is returned. Once it has waited `after_s`, it says once what it waits for (the group,
    its topic, the broker, its instance id), and later after how long it joined. A broker
    that does not answer (restarting) is waited for, said every `after_s`."""
    said: list[float] = []  # when it last said the broker does not answer

    def waiting(exc: Exception) -> None:
        if not said or time.monotonic() - said[-1] >= after_s:
            said.append(time.monotonic())
            logger.warning("no broker answers at %s yet (%s): waiting for it; Ctrl-C stops "
                           "this", bootstrap, exc)  # fmt: skip

    start = asyncio.ensure_future(start_all(*clients, waiting=waiting))
    stopped = asyncio.ensure_future(stop.wait() if stop is not None else asyncio.Event().wait())
    began = time.monotonic()
    try:
        await asyncio.wait([start, stopped], timeout=after_s, return_when="FIRST_COMPLETED")
        if not (start.done() or stopped.done()):
            _say_waiting(logger, clients[-1], bootstrap, time.monotonic() - began)
            await asyncio.wait([start, stopped], return_when="FIRST_COMPLETED")
            if start.done() and start.exception() is None:
                logger.warning("joined after %.0f s", time.monotonic() - began)
        if start.done():
            start.result()
            return True
        return False
    finally:
        stopped.cancel()
        if not start.done():
            start.cancel()
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                async with asyncio.timeout(STOP_S):
                    await start


def _say_waiting(logger: logging.Logger, consumer, bootstrap: str, waited_s: float) -> None:
    logger.warning(
        "waiting %.0f s so far to join group %s (topic %s, broker %s, instance id %s): a "
        "member that died without leaving holds its partitions until it is restarted with "
        "its instance id or its session times out; Ctrl-C stops this",
        waited_s,
        getattr(consumer, "_group_id", "?"),
        ", ".join(sorted(consumer.subscription())),
        bootstrap,
        getattr(consumer, "_group_instance_id", None),
    )


def rejoin(consumer, partition: TopicPartition) -> None:
    """Ask `consumer`'s group to assign its partitions again: `partition` was fenced
    while the group still had it here. The rebalance revokes every partition (the
    engine forgets their work in flight) and assigns them anew (each fenced again and read
    from its commit). Kafka Streams does the same on a fenced producer; aiokafka has no
    public call for it."""
    logging.getLogger("relstream.kafka.delivery.transactions").warning(
        "transactional producer for %s fenced while its partition is assigned here: "
        "asking the group to assign partitions again",
        partition,
    )
    consumer._coordinator.request_rejoin()
