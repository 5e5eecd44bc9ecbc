"""`relstream-lab bench zipf --backend vllm`: the Zipf stream on the real engine (vLLM).

The same windows as the simulated benchmark (`relstream_lab.zipf.sim`), fewer of them: the
CPU build takes minutes where the simulator takes a second. Capacity is stock V1's
(`v1-fcfs` serving every window at once, nothing shared); each variant then runs in an
engine of its own at a fraction of it. Latency is measured here, from a window's
submission to its whole result, so a window answered from the cache counts too. The
answers of every relstream variant are compared with those of relstream with nothing
shared: greedy decoding must give every row the same text.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass
from itertools import accumulate

from relstream.engine.runtime import EngineSettings, VllmRuntime
from relstream.model import RelQuery, Row, Template
from relstream_lab.common.report import write_readme
from relstream_lab.common.runner import percentile
from relstream_lab.common.workload import TraceConfig, unit_gaps
from relstream_lab.zipf.sim import MAX_TOKENS, TEMPLATE, ZipfOptions, read_beers, zipf_windows

ANSWER_CACHE_BYTES = 256 << 20


@dataclass(frozen=True)
class RealVariant:
    policy: str
    share_identical: bool
    answer_cache: bool


REAL_VARIANTS = {
    "v1-priority": RealVariant("v1-priority", False, False),
    "relstream, nothing shared": RealVariant("relstream", False, False),
    "relstream + computed once": RealVariant("relstream", True, False),
    "relstream + computed once + answer cache": RealVariant("relstream", True, True),
}
REFERENCE = "relstream, nothing shared"  # whose answers every relstream variant must give


def window_relqueries(options: ZipfOptions, seed: int) -> list[RelQuery]:
    beers = read_beers(options.datasets_dir)
    template = Template(TEMPLATE)
    return [
        RelQuery(
            f"w{index}",
            template,
            [Row(f"w{index}r{row}", beers[beer]) for row, beer in enumerate(window)],
            MAX_TOKENS,
        )
        for index, window in enumerate(zipf_windows(options, seed, len(beers)))
    ]


async def serve(
    settings: EngineSettings, relqueries: list[RelQuery], arrivals: list[float] | None
) -> dict:
    """Submit each window at its arrival (all at once for None); latencies and answers."""
    engine = await VllmRuntime.start(settings)
    try:
        started = time.monotonic()

        async def one(relquery: RelQuery, at: float) -> tuple[float, list[str], int]:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            submitted = time.monotonic()
            result = await (await engine.submit(relquery)).result()
            cached = sum(row.cached for row in result.rows)
            return time.monotonic() - submitted, [row.output or "" for row in result.rows], cached

        times = arrivals or [0.0] * len(relqueries)
        done = await asyncio.gather(
            *(one(rq, at) for rq, at in zip(relqueries, times, strict=True))
        )
        return {
            "makespan": time.monotonic() - started,
            "latencies": [latency for latency, _, _ in done],
            "answers": [answers for _, answers, _ in done],
            "rows_cached": sum(cached for _, _, cached in done),
            "rows_shared": engine.rows_shared,
        }
    finally:
        engine.shutdown()


def run_real(options: ZipfOptions, seed: int, say=print) -> list[dict]:
    relqueries = window_relqueries(options, seed)
    capacity_run = asyncio.run(
        serve(EngineSettings(policy="v1-fcfs", share_identical=False), relqueries, None)
    )
    capacity = len(relqueries) / capacity_run["makespan"]
    rate = options.load * capacity
    say(f"capacity {capacity:.3f} windows/s; serving at {rate:.3f}")
    gaps = unit_gaps(TraceConfig(num_relqueries=options.relqueries, seed=seed))
    arrivals = [t / rate for t in accumulate(gaps)]
    runs = {}
    for name, variant in REAL_VARIANTS.items():
        settings = EngineSettings(
            policy=variant.policy,
            share_identical=variant.share_identical,
            answer_cache_bytes=ANSWER_CACHE_BYTES if variant.answer_cache else 0,
        )
        runs[name] = asyncio.run(serve(settings, relqueries, arrivals))
        say(f"{name}: mean {statistics.fmean(runs[name]['latencies']):.2f} s")
    rows = sum(len(rq.rows) for rq in relqueries)
    reference = runs[REFERENCE]["answers"]
    return [
        {
            "variant": name,
            "seed": seed,
            "capacity": capacity,
            "rate": rate,
            "rows": rows,
            "mean": statistics.fmean(run["latencies"]),
            "p99": percentile(run["latencies"], 0.99),
            "makespan": run["makespan"],
            "rows_shared": run["rows_shared"],
            "rows_cached": run["rows_cached"],
            "answers_differing": sum(
                mine != theirs
                for ours, ref in zip(run["answers"], reference, strict=True)
                for mine, theirs in zip(ours, ref, strict=True)
            ),
        }
        for name, run in runs.items()
    ]


def write_real_report(records: list[dict], out, command: str, machine: str) -> None:
    import json

    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(records, indent=1) + "\n")
    first = records[0]
    lines = [
        "# The Zipf stream on the real engine (vLLM CPU build, SmolLM2-135M)",
        "",
        f"Reproduce with:\n\n```\n{command}\n```\n",
        f"Machine: {machine}. Seed {first['seed']}: {first['rows']} rows in windows arriving at "
        f"{first['rate']:.3f}/s, {first['rate'] / first['capacity']:.2f} of stock V1's capacity "
        f"({first['capacity']:.3f}/s: `v1-fcfs` serving every window at once, nothing shared).",
        "",
        "| seed | variant | mean (s) | v1-priority / mean | p99 (s) | makespan (s) "
        "| rows shared | rows cached | answers differing from nothing shared |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    baseline = {r["seed"]: r["mean"] for r in records if r["variant"] == "v1-priority"}
    for r in records:
        lines.append(
            f"| {r['seed']} | {r['variant']} | {r['mean']:.2f} "
            f"| {baseline[r['seed']] / r['mean']:.2f}x "
            f"| {r['p99']:.1f} | {r['makespan']:.1f} | {r['rows_shared']} | {r['rows_cached']} "
            f"| {r['answers_differing'] if r['variant'] != 'v1-priority' else '—'} |"
        )
    write_readme(out, [*lines, ""])
