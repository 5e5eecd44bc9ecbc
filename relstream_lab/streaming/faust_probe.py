"""Can the window stage be a Faust agent? The measurement behind docs/architecture/stream.md,
"Why the window stage is not a Faust agent".

The prototype worker runs the window stage as a Faust agent over a Faust topic: it
reads micro-batches with `Stream.noack_take`, checks each row and cuts each partition into
windows as the real stage does (`stream.windowing`), sends each closed window's relQuery
and waits for the broker's acknowledgement, then acknowledges (`Stream.ack`) every event
below the partition's committable offset, so Faust commits only there. `measure` starts it
from the worker's environment as it starts `relstream worker` (this file run as a script,
`worker` and the arguments of `relstream worker` that the streaming benchmark passes).

`measure` runs the streaming benchmark's window-stage measurement itself
(`relstream_lab.streaming.run.window_throughput`: worker warmed, rows rounded to whole
windows and produced live, rows/s to the last relQuery, the CPU seconds the worker process
spent on them: rows per CPU-second, what one core would sustain whatever else the machine
runs) on one embedded Tansu broker, alternating the real worker and the prototype. The
prototype, like the real stage, also closes windows by a timer when no row comes. It prints
the figures as JSON. Run from the engine's environment:

    relstream-lab bench faust-agent \\
        --stream-python .venv-stream/bin/python --rows 100000 --repeats 2 \\
        > docs/benchmarks/streaming/faust_agents.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from collections import defaultdict, deque
from pathlib import Path

HERE = Path(__file__).resolve()


def _worker(args: argparse.Namespace) -> None:
    import faust

    from relstream.kafka.clients.aio import portable_session
    from relstream.kafka.clients.topics import Topics
    from relstream.stream.registrations import load_registrations
    from relstream.stream.windowing import PartitionWindows, RowRejection, check_row
    from relstream.stream.windowing import relquery_for_window as relquery
    from relstream.wire import RowMessage, encode

    (registration,) = load_registrations(Path(args.config))
    bare_row = RowMessage(table=registration.table, key="k", values={"text": "item"})
    topics = Topics(args.prefix)
    sessions = portable_session(args.broker_kind)
    app = faust.App(
        args.app_id,
        broker=f"kafka://{args.bootstrap}",
        key_serializer="raw",
        value_serializer="raw",
        topic_partitions=topics.partitions,
        topic_allow_declare=False,
        consumer_auto_offset_reset="earliest",
        web_enabled=False,
        store="memory://",
        datadir=tempfile.mkdtemp(prefix="faust-agents-"),
        broker_max_poll_records=10_000,  # Faust's best case: as large a fetch as the stage's
        stream_buffer_maxsize=20_000,
        **{f"broker_{k.removesuffix('_ms')}": v / 1000 for k, v in sessions.items()},
    )
    rows_topic = app.topic(topics.rows(registration.table), key_type=bytes, value_type=bytes)
    relqueries = app.topic(topics.relqueries, key_type=bytes, value_type=bytes)
    cutters: dict[int, PartitionWindows] = {}
    held: dict[int, deque] = defaultdict(deque)  # events not yet acknowledged, in order

    async def publish(closed: list) -> None:
        sent = []
        for window in closed:
            window_id = window.window_id(registration.name)
            value = encode(relquery(registration, window.rows, window_id))
            sent.append(await relqueries.send(key=b"k", value=value))  # any key will do
        await asyncio.gather(*sent)  # every relQuery on the broker before an ack

    def expired() -> list:
        now = time.time()
        return [w for c in cutters.values() if (w := c.expire(now, 1.0)) is not None]

    @app.timer(interval=0.1)
    async def expire_by_clock():  # as the real stage: a window closes with no row coming
        await publish(expired())

    @app.agent(rows_topic, name=f"window-{registration.name}")
    async def window(stream):
        async for events in stream.noack_take(10_000, within=0.1):
            closed = []
            for event in events:
                message = event.message
                cutter = cutters.get(message.partition)
                if cutter is None:
                    cutter = cutters[message.partition] = PartitionWindows(
                        registration, message.partition
                    )
                if args.bare:  # no decoding or checking: Faust's own cost per event
                    row = bare_row
                else:
                    checked = check_row(registration, event.value, message.headers)
                    row = None if isinstance(checked, RowRejection) else checked
                held[message.partition].append(event)
                closed += cutter.add(message.offset, message.timestamp, row)
            await publish(closed + expired())
            for partition, cutter in cutters.items():
                waiting, limit = held[partition], cutter.committable()
                while waiting and waiting[0].message.offset < limit:
                    await stream.ack(waiting.popleft())

    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def measure(stream_python: str, rows: int, repeats: int) -> None:
    """Each worker's window-stage figures, `repeats` runs of `rows` rows each, alternating,
    as JSON on stdout (each run's also on stderr as it ends)."""
    from relstream.kafka.tools.brokers import EmbeddedBroker

    commands = {
        "current stage (aiokafka batches)": [stream_python, "-m", "relstream"],
        "Faust agent (noack_take)": [stream_python, str(HERE)],
        "Faust agent, rows not decoded": [stream_python, str(HERE), "--bare"],
    }
    figures: dict[str, list[dict]] = {name: [] for name in commands}
    with tempfile.TemporaryDirectory() as workdir, EmbeddedBroker("tansu") as broker:
        for _ in range(repeats):
            for name, command in commands.items():
                figure = _window_stage(broker, rows, command, Path(workdir))
                figures[name].append(figure)
                print(name, figure, file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows, "runs": figures}, indent=2))


def _window_stage(broker, rows: int, command: list[str], workdir: Path) -> dict:
    """The streaming benchmark's window-stage run (`streambench.window_throughput`: warmed,
    then `rows` rounded to whole windows, produced live, round-robin, timed to the last
    relQuery), with the rows per CPU-second of the worker process."""
    from relstream_lab.streaming import run as streambench

    found = streambench.window_throughput(broker, rows, command, workdir)
    return {
        "rows": found["rows"],
        "rows_per_second": round(found["rows_per_second"]),
        "rows_per_cpu_second": round(found["rows"] / found["cpu_seconds"]),
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    """The prototype worker, started by `measure` as `start_worker` starts one:
    `faust_probe.py [--bare] worker --bootstrap ... --config ...`."""
    parser = argparse.ArgumentParser(description="the window stage as a Faust agent")
    parser.add_argument("--bare", action="store_true", help="skip decoding rows")
    parser.add_argument("mode", choices=["worker"])
    for option in ("--bootstrap", "--config", "--prefix", "--broker-kind", "--app-id"):
        parser.add_argument(option)
    parser.add_argument("--ready-file")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    _worker(args)


if __name__ == "__main__":
    main()
