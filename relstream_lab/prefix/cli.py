"""`relstream-lab bench prefix`: prompt tokens left to compute by the prefix cache."""

from __future__ import annotations

from pathlib import Path

import click

from relstream.cli.common import console, csv_of
from relstream_lab.common.options import datasets_option, typed_command


@click.command()
@datasets_option
@click.option("--rows", default=1000, show_default=True, help="Rows of each table.")
@click.option("--window", default=100, show_default=True, help="Rows per relQuery.")
@click.option(
    "--blocks",
    default="16,128",
    show_default=True,
    callback=csv_of(int),
    help="KV block sizes: a GPU's 16, the CPU build's 128.",
)
@click.option(
    "--backend",
    type=click.Choice(["count", "vllm"]),
    default="count",
    show_default=True,
    help="vllm: the real engine computes one window of --window rows per table and query "
    "type, templates against free fields (minutes).",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("out/prefix"))
def prefix(
    datasets: Path | None,
    rows: int,
    window: int,
    blocks: tuple[int, ...],
    backend: str,
    out: Path,
) -> None:
    """Per table and query type of the paper's trace: prompt tokens the prefix cache leaves
    to compute with the templates in arrival order (stock V1), in prompt order, and with
    the fields free and laid out shared first (relstream)."""
    from relstream_lab.common.templates import QUERY_TYPES
    from relstream_lab.common.workload import load_datasets
    from relstream_lab.prefix.sim import measure_cell, write_report

    command = typed_command()
    if backend == "vllm":
        from relstream_lab.prefix.real import run_real

        run_real(load_datasets(datasets), window, out, command, console.print)
        console.print(f"wrote {out}/README.md")
        return
    cells = []
    for dataset in load_datasets(datasets):
        for query_type in QUERY_TYPES:
            cells += measure_cell(dataset, query_type, rows, window, blocks)
            console.print(f"{dataset.spec.name} {query_type}: measured")
    write_report(cells, out, command)
    console.print(f"wrote {out}/README.md")
