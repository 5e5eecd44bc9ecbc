"""Apache Kafka in KRaft mode on 127.0.0.1: one node (broker and controller in one
process) or three, from the jars `kafkadist` fetched.

Each node keeps its log under `data_dir/node-N`, formatted once with the cluster id kept
in `data_dir/cluster.id`, so a restart keeps topics and committed offsets. The settings
every node shares are `apache/broker.properties` (docker-compose.yml mounts the same
file); this module adds only what is per node (id, listeners, quorum, folder) and, for
three nodes, the replication that a cluster of three allows.
"""

from __future__ import annotations

import base64
import ctypes
import fcntl
import signal
import socket
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from relstream.kafka.tools.kafkadist import classpath, java, resource

# The heap each node is given (-Xmx): measured in docs/operations.md, "Apache Kafka".
HEAP_MB = 512
# With three nodes: every topic and the internal ones replicated 3, writes acknowledged
# by 2 (a node may be down).
REPLICATED = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
}


class NodeFailed(RuntimeError):
    """A node exited while starting; the message carries the end of its log."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cluster_id(data_dir: Path) -> str:
    """The cluster id kept in `data_dir/cluster.id`, made on first use (Kafka's form: 16
    random bytes, URL-safe base64 without padding)."""
    path = data_dir / "cluster.id"
    if path.exists():
        return path.read_text().strip()
    made = "-"
    while made.startswith("-"):  # as Kafka's own Uuid.randomUuid: never read as an option
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    path.write_text(made + "\n")
    return made


@dataclass
class Node:
    """One KRaft process: its id, its client port and controller port, its folder."""

    node_id: int
    port: int
    controller_port: int
    folder: Path
    process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.folder.with_name(f"node-{self.node_id}.log")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self, lines: int = 20) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


@dataclass
class KraftCluster:
    """`nodes` KRaft processes, every one broker and controller, on 127.0.0.1."""

    data_dir: Path
    nodes: int = 1
    ports: list[int] = field(default_factory=list)  # client ports; 0 or missing: free ones
    heap_mb: int = HEAP_MB
    members: list[Node] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.members)

    def prepare(self) -> None:
        """Choose ports, write each node's settings and format its folder once; nothing
        is touched where another Kafka runs on the same folders (`_check_unused`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.nodes):
            _check_unused(self.data_dir / f"node-{i + 1}")
        ports = list(self.ports) + [0] * (self.nodes - len(self.ports))
        self.members = [
            Node(i + 1, ports[i] or _free_port(), _free_port(), self.data_dir / f"node-{i + 1}")
            for i in range(self.nodes)
        ]
        cid = cluster_id(self.data_dir)
        for node in self.members:
            settings = self._settings(node)
            settings.write_text(self._properties(node))
            if not (node.folder / "meta.properties").exists():
                self._format(node, settings, cid)

    def _settings(self, node: Node) -> Path:
        return self.data_dir / f"node-{node.node_id}.properties"

    def _properties(self, node: Node) -> str:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.members)
        own = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:"
            f"{node.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.folder),
        }
        if self.nodes >= 3:
            own.update(REPLICATED)
        shared = resource("broker.properties").read_text()
        return shared + "\n# this node's own (relstream/kafka/tools/kraft.py)\n" + "".join(
            f"{key}={value}\n" for key, value in own.items()
        )

    def _jvm(self) -> list[str]:
        return [
            java(),
            f"-Xms{min(128, self.heap_mb)}m",
            f"-Xmx{self.heap_mb}m",
            # Serial GC on a heap this small: an idle node took 5.1 % of a core with it,
            # 5.8 % with G1 (docs/operations.md, "Brokers").
            "-XX:+UseSerialGC",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={resource('log4j2.properties')}",
            "-cp",
            classpath(),
        ]

    def _format(self, node: Node, settings: Path, cid: str) -> None:
        command = [*self._jvm(), "kafka.tools.StorageTool", "format", f"--cluster-id={cid}"]
        done = subprocess.run(
            [*command, "-c", str(settings), "--ignore-formatted"], capture_output=True, text=True
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise NodeFailed(f"formatting {node.folder} failed: {said[-1] if said else '?'}")

    def start_node(self, node: Node) -> None:
        """Start one node's process (its log: `node-N.log` beside its folder). Started
        from a program's main thread, the node is sent SIGTERM if that program dies
        without stopping it (SIGKILL, a crash): no Kafka outlives `relstream broker`."""
        command = [*self._jvm(), "kafka.Kafka", str(self._settings(node))]
        main = threading.current_thread() is threading.main_thread()
        with node.log_path.open("ab") as log:
            node.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_terminate_with_parent if main else None,
            )  # fmt: skip

    def start(self) -> None:
        self.prepare()
        for node in self.members:
            self.start_node(node)

    def check_alive(self) -> None:
        for node in self.members:
            if node.process is not None and node.process.poll() is not None:
                raise NodeFailed(f"Apache Kafka node {node.node_id} exited: {_said(node)}")

    def stop_node(self, node: Node, timeout: float = 30.0, kill: bool = False) -> None:
        """SIGTERM (Kafka's controlled shutdown) or SIGKILL; SIGKILL after `timeout`."""
        process, node.process = node.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop every node: all asked at once, so the last controllers still have a
        quorum while the brokers shut down."""
        running = [node for node in self.members if node.alive()]
        for node in running:
            node.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for node in running:
            self.stop_node(node, max(0.1, deadline - time.monotonic()))


try:  # looked up here: nothing is loaded in a child between fork and exec
    _PRCTL = ctypes.CDLL(None).prctl
except (OSError, AttributeError):  # not Linux
    _PRCTL = None


def _terminate_with_parent() -> None:
    """In the child before it runs Java: SIGTERM when the parent dies (Linux's
    PR_SET_PDEATHSIG; the parent's thread, so main threads only: `start_node`)."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


def _check_unused(folder: Path) -> None:
    """Raise `NodeFailed` where a running Kafka holds `folder`'s lock: Kafka locks each log
    folder's `.lock` file (Java's FileLock, a POSIX record lock, which `lockf` sees)."""
    lock = folder / ".lock"
    if not lock.exists():
        return
    with lock.open("a") as held:
        try:
            fcntl.lockf(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise NodeFailed(
                f"Apache Kafka is already running on {folder.parent}: stop it, or give "
                "another --data-dir"
            ) from None
        fcntl.lockf(held, fcntl.LOCK_UN)


def _said(node: Node) -> str:
    """The first error line of a node's log, else its last line."""
    tail = node.tail(40).splitlines()
    errors = [line for line in tail if " ERROR " in line or "Exception" in line]
    return (errors or tail or ["no output"])[0 if errors else -1][:300]

