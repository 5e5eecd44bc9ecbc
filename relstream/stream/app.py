"""The worker (`relstream worker`): rows topics → windows → the relqueries topic.

A Faust app that uses Faust for the worker process (start, stop, signals, logging) and
runs one window stage per registration (`stage.WindowStage`) as an app task, not as a
Faust agent: each stage reads its rows topic a batch at a time with its own consumer,
cuts every input partition into windows by row count and by the rows' own timestamps
(`windowing`), produces one relQuery per window and dead-letters rows that cannot be
used, with the reason. Offsets are committed only once the relQuery is on the broker,
and never past a window still open, so a restarted worker cuts the same windows under
the same ids. A Faust agent was measured and ruled out: Faust's per-event path holds it
under the worker's throughput goal, and Faust acknowledges some events on its own, which
can commit past an open window (docs/architecture/stream.md, "Why the window stage is not a
Faust agent"). Runs in its own
environment (`relstream[stream]`), since faust-streaming and vLLM pin conflicting clicks."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

import faust
import platformdirs

from relstream.kafka.clients.aio import client_settings, portable_session
from relstream.kafka.clients.security import PLAINTEXT, KafkaSecurity
from relstream.kafka.clients.topics import Topics
from relstream.kafka.membership.static import member_slot
from relstream.placement.book import placement_of
from relstream.placement.readers import AsyncLoadReader
from relstream.ready import mark_ready
from relstream.stream.registrations import QueryRegistration, worker_group
from relstream.stream.stage import StageSettings, WindowStage


def default_data_dir() -> Path:
    """Where workers keep Faust's data by default, e.g. ~/.local/share/relstream/worker."""
    return Path(platformdirs.user_data_dir("relstream")) / "worker"


def build_app(
    bootstrap: str,
    registrations: list[QueryRegistration],
    topics: Topics | None = None,
    app_id: str = "relstream-worker",
    broker_kind: str | None = None,
    security: KafkaSecurity = PLAINTEXT,
    ready_file: Path | None = None,
    data_dir: Path | None = None,
    instance_id: str | None = None,
) -> faust.App:
    """The worker's Faust app: one window stage per registration. Once every stage reads
    its rows topic (its group joined), `ready_file` (if given) is written
    (`relstream.ready`), for launchers and a container's healthcheck.
    Faust keeps its (here empty) state under `data_dir` / `app_id`: by default the user
    data dir, never the current directory (Faust's own default). `instance_id`: each
    stage's static member id in its group (`kafka.membership.static`; None: this host's slot)."""
    topics = topics or Topics()
    data_dir = data_dir if data_dir is not None else default_data_dir()
    data_dir.mkdir(parents=True, exist_ok=True)  # Faust makes only the last folder
    # Faust spells the consumer's session settings in seconds.
    sessions = {**client_settings(broker_kind), **portable_session(broker_kind)}
    settings = {
        f"broker_{name.removesuffix('_ms')}": value / 1000 for name, value in sessions.items()
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
        datadir=str(data_dir / app_id),
        broker_credentials=security.faust_credentials(),
        **settings,
    )
    # Faust's own consumer reads nothing here (only agents of your own, `add_agents`, give
    # it topics), so it is not started: it would only wait for its group and hold back the
    # stages.
    app.boot_strategy = faust.app.BootStrategy(app, enable_kafka_consumer=False)
    # Each window's relQuery goes to the least loaded engine while engines report their
    # load, else by its key's hash (docs/operations.md, Scale-out); RELSTREAM_PLACEMENT=hash:
    # always.
    placer = None
    if placement_of(None) == "load":
        placer = AsyncLoadReader(bootstrap, topics, broker_kind, security)
    stages = []
    for registration in registrations:
        group = worker_group(app_id, registration.name)
        # Its static member id (held for the life of the process), the same after a restart.
        member = member_slot(bootstrap, group, broker_kind, instance_id).instance_id
        stage = StageSettings(bootstrap, topics, group, broker_kind, security, instance_id=member)
        stages.append(WindowStage(registration, stage, placer))

    @app.task
    async def window_stages() -> None:
        if placer is not None:
            await placer.start()
        runs = asyncio.gather(*(stage.run() for stage in stages))
        ready = asyncio.gather(*(stage.ready.wait() for stage in stages))
        try:  # a stop while the stages wait for their groups lands in the first wait
            await asyncio.wait([runs, ready], return_when=asyncio.FIRST_COMPLETED)
            if ready.done() and ready_file is not None:
                mark_ready(ready_file, f"{len(stages)} window stages ready")
            ready.cancel()
            await runs
        finally:
            for gathered in (ready, runs):
                gathered.cancel()
            await asyncio.gather(ready, runs, return_exceptions=True)
            if placer is not None:
                await placer.stop()

    return app


class AgentsError(Exception):
    """A file given as the worker's own agents that does not declare them."""


def add_agents(app: faust.App, topics: Topics, path: Path, instance_id: str | None = None) -> None:
    """Your own Faust agents beside the window stages (`relstream worker --agents`): the
    Python file at `path` defines `agents(app, topics)`, which declares them on `app`, for
    example one that filters or enriches rows on their way to a rows topic
    (docs/examples/enrich_reviews.py). They run under Faust's own acks: an event is
    committed once the agent has handled it and the app's producer has flushed. Faust's
    consumer is then started, as the static member `instance_id` of the app's group."""
    spec = importlib.util.spec_from_file_location(f"relstream_agents_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise AgentsError(f"{path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    declare = getattr(module, "agents", None)
    if not callable(declare):
        raise AgentsError(f"{path} defines no agents(app, topics) function")
    declare(app, topics)
    app.boot_strategy = faust.app.BootStrategy(app)  # Faust's consumer reads for them
    app.conf.consumer_group_instance_id = instance_id
