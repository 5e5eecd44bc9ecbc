"""`relstream ...`: one command group; each module below adds its commands."""

from __future__ import annotations

import click

from relstream.cli.bench import bench
from relstream.cli.demo import demo
from relstream.cli.engine import engine, serve
from relstream.cli.model import model
from relstream.cli.rows import produce, results, sink
from relstream.cli.streaming import broker, worker
from relstream.cli.sustained import bench_sustained


@click.group()
@click.version_option(package_name="relstream")
def main() -> None:
    """relstream: low-latency LLM queries over tables."""


for command in (
    bench,
    bench_sustained,
    model,
    broker,
    engine,
    serve,
    worker,
    produce,
    results,
    sink,
    demo,
):
    main.add_command(command)
