"""`relstream bench --backend vllm`: the paper-style trace on the real engine.

Load is a fraction of this engine's measured capacity (relQueries/s when the whole trace
is submitted at once under fcfs), so the same command means the same on any machine.
Each policy runs in its own engine with a step log; from the logs come the scheduling
overhead, a fitted cost model, and the simulator's prediction of the same runs.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from relstream.backend import RelQueryBackend
from relstream.bench.runner import Measured, RunSummary, summarize_outcomes
from relstream.bench.workload import TraceConfig, TraceEntry, generate_relqueries, load_datasets
from relstream.engine.runtime import EngineSettings, RelQueryEngine
from relstream.scheduler import EngineLimits
from relstream.sim.profiles import fit_line


@dataclass(frozen=True)
class VllmBenchOptions:
    model: str
    policies: tuple[str, ...]
    load_fractions: tuple[float, ...]
    trace: TraceConfig
    datasets_dir: Path | None
    out_dir: Path
    command: str = ""


@dataclass
class ReplayResult:
    outcomes: list[Measured]
    window: tuple[float, float]  # monotonic start and end, to cut the step log
    row_errors: int
    output_tokens: dict[str, list[int]]  # relQuery id -> tokens each row generated


async def replay(
    engine: RelQueryBackend, entries: Sequence[TraceEntry], rate: float | None
) -> ReplayResult:
    """Submit each relQuery at its arrival time (all at once when rate is None)."""
    started = time.monotonic()
    handles = []
    for entry in entries:
        if rate is not None:
            delay = started + entry.relquery.arrival_time / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        handles.append((entry, await engine.submit(entry.relquery)))
    outcomes, errors, output_tokens = [], 0, {}
    for entry, handle in handles:
        result = await handle.result()
        errors += sum(1 for row in result.rows if row.status != "ok")
        output_tokens[result.relquery_id] = [row.output_tokens for row in result.rows]
        if result.latency is not None:
            outcomes.append(Measured(result.latency, entry.query_type))
    return ReplayResult(outcomes, (started, time.monotonic()), errors, output_tokens)


def read_step_log(path: Path) -> tuple[dict, list[dict]]:
    header: dict = {}
    steps: list[dict] = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("event") == "start":
            header = record
        else:
            steps.append(record)
    return header, steps


def step_stats(steps: Sequence[dict]) -> dict:
    busy = sum(s["duration_s"] for s in steps)
    overhead = sum(s["decision_s"] + s["adapter_s"] for s in steps)
    kinds: dict[str, int] = {}
    for step in steps:
        kinds[step["kind"]] = kinds.get(step["kind"], 0) + 1
    decodes = [
        s["decode_requests"] for s in steps if s["kind"] != "prefill" and s["decode_requests"]
    ]
    return {
        "steps": kinds,
        "mean_decode_batch": statistics.fmean(decodes) if decodes else 0.0,
        "busy_s": busy,
        "scheduling_overhead_s": overhead,
        "overhead_fraction": overhead / busy if busy else 0.0,
    }


def fit_cost_model(steps: Sequence[dict]) -> dict:
    """Least-squares lines through pure prefill and pure decode steps (paper's form)."""
    prefill = [(s["uncached_tokens"], s["duration_s"]) for s in steps if s["kind"] == "prefill"]
    decode = [(s["decode_requests"], s["duration_s"]) for s in steps if s["kind"] == "decode"]
    prefill_line, decode_line = fit_line(prefill), fit_line(decode)
    return {
        "alpha_p": prefill_line.slope,
        "beta_p": prefill_line.intercept,
        "alpha_d": decode_line.slope,
        "beta_d": decode_line.intercept,
        "prefill_steps": len(prefill),
        "decode_steps": len(decode),
    }


async def _serve_policy(
    options: VllmBenchOptions,
    policy: str,
    entries: Sequence[TraceEntry],
    rates: Sequence[float | None],
    log: Path,
) -> list[ReplayResult]:
    engine = await RelQueryEngine.start(
        EngineSettings(model=options.model, policy=policy, step_log=log)
    )
    try:
        await replay(engine, entries[:2], None)  # warm-up: first steps pay one-off costs
        return [await replay(engine, entries, rate) for rate in rates]
    finally:
        engine.shutdown()


def run_vllm_benchmark(
    options: VllmBenchOptions, on_run: Callable[[str], None] | None = None
) -> dict:
    out = options.out_dir
    out.mkdir(parents=True, exist_ok=True)
    entries = generate_relqueries(options.trace, load_datasets(options.datasets_dir))
    capacity_log = out / "steps-capacity.jsonl"
    capacity_log.unlink(missing_ok=True)
    (capacity_run,) = asyncio.run(
        _serve_policy(options, "v1-fcfs", entries, [None], capacity_log)
    )
    capacity = len(entries) / (capacity_run.window[1] - capacity_run.window[0])
    rates = [fraction * capacity for fraction in options.load_fractions]
    if on_run:
        on_run(f"capacity {capacity:.4f} relQueries/s")
    summaries: list[RunSummary] = []
    all_steps: list[dict] = []
    header: dict = {}
    overhead: dict[str, dict] = {}
    for policy in options.policies:
        log = out / f"steps-{policy}.jsonl"
        log.unlink(missing_ok=True)
        runs = asyncio.run(_serve_policy(options, policy, entries, rates, log))
        header, steps = read_step_log(log)
        all_steps += steps
        for fraction, run in zip(options.load_fractions, runs, strict=True):
            window = [s for s in steps if run.window[0] <= s["t"] <= run.window[1]]
            stats = step_stats(window)
            overhead[f"{policy}@{fraction:g}"] = stats
            summary = summarize_outcomes(
                policy,
                fraction,
                run.outcomes,
                [s["decision_s"] + s["adapter_s"] for s in window],
                makespan=run.window[1] - run.window[0],
                steps=stats["steps"],
                cost_coefficients={},
                preemptions=0,
            )
            summaries.append(summary)
            if on_run:
                on_run(f"{policy} at {fraction:g} of capacity: mean {summary.mean:.2f} s")
    coefficients = fit_cost_model(all_steps)
    limits = EngineLimits(**header["limits"])
    return {
        "capacity_relqueries_per_s": capacity,
        "rates": dict(zip((f"{f:g}" for f in options.load_fractions), rates, strict=True)),
        "summaries": summaries,
        "overhead": overhead,
        "fitted_cost_model": coefficients,
        "limits": asdict(limits),
        "entries": entries,
        "steps": all_steps,
        # Greedy decoding makes these the same under every policy: the simulator's
        # replay takes each row's real length from here.
        "output_tokens": capacity_run.output_tokens,
    }


def mean_overhead_fraction(overhead: dict[str, dict], policy: str) -> float:
    fractions = [v["overhead_fraction"] for k, v in overhead.items() if k.startswith(f"{policy}@")]
    return statistics.fmean(fractions) if fractions else float("nan")
