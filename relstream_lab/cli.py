"""`relstream-lab ...`: the lab's command group, one subgroup for the benchmarks and one for
the drills; each experiment's package adds its command."""

from __future__ import annotations

import click

from relstream.cli import Commands
from relstream.extras import require
from relstream_lab.campaign.cli import campaign, ceiling, frontier, repeats
from relstream_lab.device.cli import gpu_steps
from relstream_lab.drills.cli import drill
from relstream_lab.fairshare.cli import fairshare
from relstream_lab.idle.cli import idle
from relstream_lab.kvbound.cli import kv_bound
from relstream_lab.paper.cli import paper, scheduler_cost
from relstream_lab.placement.cli import placement
from relstream_lab.prefix.cli import prefix
from relstream_lab.priority.cli import priority
from relstream_lab.streaming.cli import faust_agent, streaming
from relstream_lab.sustained.cli import sustained
from relstream_lab.zipf.cli import zipf


@click.group(cls=Commands)
@click.version_option(package_name="relstream")
def main() -> None:
    """relstream's lab: the paper's benchmarks and the drills."""


@main.group()
def bench() -> None:
    """Benchmarks: the paper's trace, the real-engine campaign, sustained load, and more."""
    require("lab")


for command in (
    paper,
    kv_bound,
    gpu_steps,
    priority,
    fairshare,
    scheduler_cost,
    campaign,
    ceiling,
    frontier,
    repeats,
    streaming,
    faust_agent,
    sustained,
    zipf,
    prefix,
    placement,
    idle,
):
    bench.add_command(command)
main.add_command(drill)
