"""The idle benchmark's README: per broker and process, the share of one core in every
run, its median and spread, and the first row's latency after the idle spell."""

from __future__ import annotations

import statistics

from relstream.cli.common import console
from relstream_lab.idle.run import ROLES

NAMES = {"kafka": "default (`relstream broker`, Apache Kafka)", "tansu": "`--memory` (Tansu)"}


def show(record: dict) -> None:
    for number, (took, wrote) in enumerate(
        zip(record.get("round_s", []), record.get("round_written_mb", []), strict=True)
    ):
        console.print(f"{record['broker']} round {number + 1}: {took:.1f} s, broker wrote "
                      f"{wrote:.0f} MB")  # fmt: skip
    if record.get("round_s"):
        console.print(f"sink stored {record['sink_rows']:,} rows, "
                      f"{record['sink_distinct']:,} distinct")  # fmt: skip
    cpu = ", ".join(f"{role} {record['cpu'][role]:.1%}" for role in ROLES)
    written = record.get("written", {}).get("broker", 0.0)
    console.print(
        f"{record['broker']} run {record['run']}: {cpu}; broker writes {written:.2f} MB/s, "
        f"store {record.get('store_mb', 0.0):.0f} MB after {record.get('rows', 0):,} rows; "
        f"first row after the idle spell {record['first_row_s']:.2f} s "
        f"(load {record['load_before']:.1f})"
    )


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.1%} ({min(values):.1%}-{max(values):.1%})"


def markdown(document: dict) -> list[str]:
    runs = document["runs"]
    seconds = runs[0]["seconds"] if runs else 0
    lines = [
        "# Idle CPU: the walkthrough's pipeline with nothing flowing",
        "",
        "The README walkthrough's broker, worker and engine (`--backend sim`), started as "
        "there, each ready, then left idle: each process's CPU time, its children included, "
        f"over {seconds:.0f} s with no row flowing, as a share of one core; then one row "
        "produced and the time until its result is read (the window closes after its "
        "2 s).",
        "",
        f"Command: `{document['command']}`",
        "",
        f"Machine: {document['machine']}",
        "",
        "Median over the runs (lowest-highest):",
        "",
        "| on | runs | " + " | ".join(ROLES) + " | first row after idle (s) |",
        "|---|---|" + "---|" * len(ROLES) + "---|",
    ]
    for broker in dict.fromkeys(run["broker"] for run in runs):
        mine = [run for run in runs if run["broker"] == broker]
        cells = [_cell([run["cpu"][role] for run in mine]) for role in ROLES]
        first = [run["first_row_s"] for run in mine]
        lines.append(
            f"| {NAMES.get(broker, broker)} | {len(mine)} | "
            + " | ".join(cells)
            + f" | {statistics.median(first):.2f} ({min(first):.2f}-{max(first):.2f}) |"
        )
    lines += [
        "",
        "Every run (share of one core; the machine's 1-minute load average before and "
        "after the spell):",
        "",
        "| on | run | " + " | ".join(ROLES) + " | first row (s) | load | rows before | "
        "broker writes (MB/s) | store (MB) |",
        "|---|---|" + "---|" * len(ROLES) + "---|---|---|---|---|",
    ]
    for run in runs:
        cells = [f"{run['cpu'][role]:.1%}" for role in ROLES]
        lines.append(
            f"| {run['broker']} | {run['run']} | "
            + " | ".join(cells)
            + f" | {run['first_row_s']:.2f} | {run['load_before']:.1f}-{run['load_after']:.1f}"
            + f" | {run.get('rows', 0):,} | {run.get('written', {}).get('broker', 0.0):.2f}"
            + f" | {run.get('store_mb', 0.0):.0f} |"
        )
    rounds = [run for run in runs if run.get("round_s")]
    if rounds:
        lines += [
            "",
            "Rows in rounds before the spell (`--rounds`): each round from its first row "
            "produced to its last answered, the MB the broker wrote meanwhile, and the rows "
            "the following JSONL sink stored (distinct keys):",
            "",
            "| on | run | rounds (s) | last / first | broker wrote (MB) | sink rows (distinct) |",
            "|---|---|---|---|---|---|",
        ]
    for run in rounds:
        took, wrote = run["round_s"], run["round_written_mb"]
        lines.append(
            f"| {run['broker']} | {run['run']} | {', '.join(f'{t:.1f}' for t in took)} | "
            f"{took[-1] / took[0]:.2f} | {', '.join(f'{w:.0f}' for w in wrote)} | "
            f"{run['sink_rows']:,} ({run['sink_distinct']:,}) |"
        )
    return [*lines, ""]
