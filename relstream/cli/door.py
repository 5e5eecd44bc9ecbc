"""`relstream serve`'s HTTP door: its bounds on what it holds at once
(`service/doorlimits.py`; past any of them a request is a 429 with `Retry-After`), and the
server that serves it beside the engine."""

from __future__ import annotations

import asyncio
import socket

import click

from relstream.cli.common import console
from relstream.ready import mark_ready
from relstream.service.doorlimits import MAX_BODY_MIB, MAX_RELQUERIES, MAX_ROWS, DoorLimits

_OPTIONS = (
    click.option(
        "--http-max-relqueries",
        default=MAX_RELQUERIES,
        show_default=True,
        type=click.IntRange(1),
        help="RelQueries the HTTP door holds at once, served here or forwarded, from "
        "their request's arrival to their answer.",
    ),
    click.option(
        "--http-max-rows",
        default=MAX_ROWS,
        show_default=True,
        type=click.IntRange(1),
        help="Their rows; a relQuery of more rows is a 413.",
    ),
    click.option(
        "--http-max-mb",
        default=MAX_BODY_MIB,
        show_default=True,
        type=click.IntRange(1),
        help="Their request bodies, in MiB; a larger body is a 413.",
    ),
)


def door_limit_options(command):
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def door_limits(opts: dict) -> DoorLimits:
    """The bounds the options say, taken out of `opts`."""
    return DoorLimits(
        relqueries=opts.pop("http_max_relqueries"),
        rows=opts.pop("http_max_rows"),
        body_bytes=opts.pop("http_max_mb") << 20,
    )


async def http_door(backend, service, door: socket.socket, stop: asyncio.Event, opts) -> None:
    """Serve HTTP on `door` until `stop`, placing relQueries by load where the engine has
    Kafka and load reports (`service.forward`)."""
    from relstream.service.forward import door_placement

    # With Kafka and load reports, the door places its relQueries as the worker does.
    placement = door_placement(service.config, service.engine_name) if service else None
    if placement is None:
        await _serve_door(backend, service, door, stop, opts, None)
        return
    await placement.start()  # results followed from their end before any is sent
    try:
        await _serve_door(backend, service, door, stop, opts, placement)
    finally:
        await placement.stop()


async def _serve_door(backend, service, door, stop, opts, placement) -> None:
    import uvicorn

    from relstream.service.http import build_http_app

    ready_file = opts["ready_file"]
    app = build_http_app(
        backend,
        service.cancel if service is not None else None,
        registry=service.metrics.registry if service is not None else None,
        placement=placement,
        limits=opts["door_limits"],
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    server.install_signal_handlers = lambda: None  # the process's handlers set `stop`
    task = asyncio.create_task(server.serve(sockets=[door]))
    while not (server.started or task.done()):
        await asyncio.sleep(0.05)
    # Said once it listens, so that a request sent on seeing this line is answered.
    host, port = door.getsockname()[:2]
    console.print(f"HTTP door on http://{host}:{port} (docs at /docs)")
    if service is None and ready_file is not None:  # with Kafka, the service says it
        mark_ready(ready_file, f"HTTP door on {host}:{port}")
    await stop.wait()
    server.should_exit = True
    await task
