"""`relstream-lab bench priority --backend vllm`: the simulated benchmark's trace on the
real engine (vLLM's CPU build), one seed at a time.

One engine under relstream serves, after a warm-up, in turn: the live relQuery alone
(its idle latency, `repeats` times, the median kept); the backfill alone (class -1, its
makespan M); the backfill with the live relQuery submitted at 0.45·M (classes); and the
same with every relQuery of class 0 (no classes). vLLM's prefix cache is emptied before
each. The backfill's makespan is its last result's latency (all arrive at once); the
step log of every run is kept beside the results (gzipped) to attribute a live
relQuery's wait.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from relstream.engine.runtime import EngineSettings, VllmRuntime
from relstream.model import RelQuery
from relstream_lab.campaign.checkpoint import compress_step_log
from relstream_lab.common.report import machine_description, write_readme
from relstream_lab.common.workload import TraceConfig, generate_relqueries, load_datasets
from relstream_lab.priority.run import BACKFILL, LIVE, LIVE_RATIO_BOUND, MAKESPAN_GROWTH_BOUND

ARRIVAL_SHARE = 0.45  # the live relQuery arrives at this share of the backfill's makespan


def real_traces(seed: int, backfill: int, rows: int, live_rows: int, datasets_dir):
    """The simulated benchmark's relQueries (`run.traces`), as the engine takes them."""
    datasets = load_datasets(datasets_dir)
    per = max(1, rows // backfill)
    config = TraceConfig(num_relqueries=backfill, min_rows=per, max_rows=per, seed=seed)
    back = [
        replace(e.relquery, id=f"backfill-{e.relquery.id}", priority=BACKFILL)
        for e in generate_relqueries(config, datasets)
    ]
    live_config = TraceConfig(num_relqueries=1, max_rows=live_rows, seed=seed + 7919)
    (entry,) = generate_relqueries(live_config, datasets)
    live = replace(entry.relquery, id=f"live-{entry.relquery.id}", priority=LIVE)
    return back, live


async def serve(engine, relqueries: Sequence[RelQuery], live: RelQuery | None, at: float):
    """Submit `relqueries` at once and `live` (if any) `at` seconds later; every
    relQuery's latency (arrival to answer) by id, and the run's wall time."""
    started = time.monotonic()
    handles = [await engine.submit(rq) for rq in relqueries]
    if live is not None:
        await asyncio.sleep(max(0.0, started + at - time.monotonic()))
        handles.append(await engine.submit(live))
    latency = {}
    for handle in handles:
        result = await handle.result()
        latency[result.relquery_id] = result.latency.total
    return latency, time.monotonic() - started


async def measure(seed: int, options: dict, out: Path, say=print) -> dict:
    back, live = real_traces(
        seed, options["backfill"], options["backfill_rows"], options["live_max_rows"],
        options["datasets_dir"],
    )  # fmt: skip
    log = out / f"steps-seed{seed}.jsonl"
    log.unlink(missing_ok=True)
    engine = await VllmRuntime.start(EngineSettings(model=options["model"], step_log=log))
    record: dict = {"seed": seed, "live_rows": len(live.rows), "live_id": live.id}
    try:
        await serve(engine, [replace(live, id="warm-up")], None, 0.0)
        idle = []
        for _ in range(options["repeats"]):
            await engine.reset_prefix_cache()
            idle.append((await serve(engine, [live], None, 0.0))[0][live.id])
        record["idle"], record["idle_runs"] = statistics.median(idle), idle
        say(f"seed {seed}: live alone {record['idle']:.2f} s ({len(live.rows)} rows)")
        runs = (
            ("alone", back, None),
            ("classes", back, live),
            ("no_classes", [replace(rq, priority=0) for rq in back], replace(live, priority=0)),
        )
        for label, relqueries, arriving in runs:
            await engine.reset_prefix_cache()
            at = ARRIVAL_SHARE * record["alone"]["backfill_makespan"] if arriving else 0.0
            latency, wall = await serve(engine, relqueries, arriving, at)
            record[label] = {
                "backfill_makespan": max(latency[rq.id] for rq in relqueries),
                "live": latency.get(live.id),
                "arrival": at,
                "wall_s": wall,
            }
            say(f"seed {seed} {label}: {record[label]}")
    finally:
        engine.shutdown()
    return record


def run_real(options: dict, out: Path, command: str, say=print) -> dict:
    """Every seed in turn (one engine each), results.json and README.md in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    document = json.loads(path.read_text()) if path.exists() else {"runs": []}
    done = {run["seed"] for run in document["runs"]}
    document.update(command=command, machine=machine_description())
    for seed in options["seeds"]:
        if seed in done:
            continue
        document["runs"].append(asyncio.run(measure(seed, options, out, say)))
        compress_step_log(out / f"steps-seed{seed}.jsonl")  # gzipped, as the campaign's
        path.write_text(json.dumps(document, indent=1) + "\n")
        write_real_report(document, out)
    return document


def write_real_report(document: dict, out: Path) -> None:
    lines = [
        "# Real-engine benchmark: a live relQuery beside a backfill (vLLM CPU build)",
        "",
        f"Command: `{document['command']}`",
        "",
        f"Machine: {document['machine']}.",
        "",
        f"Live: the live relQuery's latency beside the backfill over its latency alone "
        f"(bound {LIVE_RATIO_BOUND}x); backfill: its makespan with the live relQuery over "
        f"alone (bound +{MAKESPAN_GROWTH_BOUND:.0%}), and in all: over the backfill with "
        f"every class 0 (the no-classes run), what being background costs it counted in.",
        "",
        "| seed | live rows | live alone | live (classes) | ratio | backfill growth | in all "
        "| live (no classes) | ratio (no classes) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in document["runs"]:
        if "no_classes" not in r:
            continue
        ours, none, alone = r["classes"], r["no_classes"], r["alone"]["backfill_makespan"]
        lines.append(
            f"| {r['seed']} | {r['live_rows']} | {r['idle']:.2f} s | {ours['live']:.2f} s | "
            f"{ours['live'] / r['idle']:.2f}x | {ours['backfill_makespan'] / alone - 1:+.1%} | "
            f"{ours['backfill_makespan'] / none['backfill_makespan'] - 1:+.1%} | "
            f"{none['live']:.2f} s | {none['live'] / r['idle']:.2f}x |"
        )
    write_readme(out, [*lines, ""])


def rebuild_real_report(out: Path) -> None:
    """README.md again from `out`'s results.json (after editing notes.md)."""
    write_real_report(json.loads((out / "results.json").read_text()), out)
