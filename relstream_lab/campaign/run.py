"""`relstream-lab bench campaign`: the paper-style trace on the real engine, as a
campaign that can decide between policies.

Capacity is measured first: the first trace submitted all at once to stock vLLM V1
(`v1-fcfs`), relQueries divided by the time to answer them all, i.e. the throughput of
the engine kept saturated. Every load is a fraction of it, so the same command means the
same on any machine. Traces differ by arrival process (Poisson, bursty gamma) and seed;
the loads in `seeded_loads` run on every seed, the others on the first. Each (trace,
load) is a cell: every policy runs it in its own engine, with a step log, and each run
is checkpointed, so a campaign of hours resumes where it stopped (`resume`), on the
same machine speed or in a new epoch with its own capacity (`campaign`).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from relstream.backend import RelQueryBackend
from relstream.engine.runtime import EngineSettings, VllmRuntime
from relstream.scheduler.data import StepKind
from relstream.scheduler.steprecord import StepLogStart, StepRecord
from relstream.sim.profiles import fit_line, profile_from_document
from relstream_lab.campaign.checkpoint import (
    Checkpoint,
    Epoch,
    check_speed,
    compress_step_log,
    discard_step_log,
    matching_epoch,
    read_step_log,
    speed_against,
    trace_name,
    warm_up_speeds,
)
from relstream_lab.campaign.stepfit import fit_step_costs, profile_document
from relstream_lab.common.report import machine_description
from relstream_lab.common.runner import Measured, summarize_outcomes
from relstream_lab.common.workload import (
    TraceConfig,
    TraceEntry,
    generate_relqueries,
    load_datasets,
)

# relserve runs as the paper runs it: step-cost lines fitted offline, here from the
# capacity run's steps (`offline_cost_lines`), and kept. Its online refit (recursive
# least squares, no context term) swung on real steps at overload (alpha_d 0-15 ms,
# beta_d 26-257 ms), where the simulator's exact step times hold it still (notes.md).
FIXED_COST_POLICIES = frozenset({"relserve"})


@dataclass(frozen=True)
class VllmBenchOptions:
    model: str
    policies: tuple[str, ...]
    load_fractions: tuple[float, ...]
    trace: TraceConfig  # size and output draws; arrival and seed vary per trace below
    datasets_dir: Path | None
    out_dir: Path
    command: str = ""
    seeds: tuple[int, ...] = (0,)  # one trace per seed (and arrival)
    seeded_loads: tuple[float, ...] = ()  # loads run on every seed; the rest on the first
    arrivals: tuple[str, ...] = ("poisson",)
    burstiness: float = 2.0  # the gamma arrivals' coefficient of variation
    resume: bool = False  # keep the runs already checkpointed in out_dir

    def traces(self) -> list[TraceConfig]:
        """Every trace of the campaign, the capacity trace first."""
        return [
            replace(
                self.trace,
                arrival=arrival,
                seed=seed,
                burstiness=self.burstiness if arrival == "gamma" else 1.0,
            )
            for arrival in self.arrivals
            for seed in self.seeds
        ]

    def loads_for(self, trace: TraceConfig) -> tuple[float, ...]:
        if trace.seed == self.seeds[0]:
            return self.load_fractions
        return tuple(load for load in self.load_fractions if load in self.seeded_loads)


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


def step_stats(steps: Sequence[StepRecord]) -> dict:
    busy = sum(s.duration_s for s in steps)
    overhead = sum(s.decision_s + s.adapter_s for s in steps)
    kinds: dict[str, int] = {}
    for step in steps:
        kinds[step.kind.value] = kinds.get(step.kind.value, 0) + 1
    decodes = [
        s.decode_requests for s in steps if s.kind is not StepKind.PREFILL and s.decode_requests
    ]
    return {
        "steps": kinds,
        "mean_decode_batch": statistics.fmean(decodes) if decodes else 0.0,
        "busy_s": busy,
        "scheduling_overhead_s": overhead,
        "overhead_fraction": overhead / busy if busy else 0.0,
    }


def fit_cost_model(steps: Sequence[StepRecord]) -> dict:
    """Least-squares lines through pure prefill and pure decode steps (paper's form)."""
    prefill = [(s.uncached_tokens, s.duration_s) for s in steps if s.kind is StepKind.PREFILL]
    decode = [(s.decode_requests, s.duration_s) for s in steps if s.kind is StepKind.DECODE]
    prefill_line, decode_line = fit_line(prefill), fit_line(decode)
    return {
        "alpha_p": prefill_line.slope,
        "beta_p": prefill_line.intercept,
        "alpha_d": decode_line.slope,
        "beta_d": decode_line.intercept,
        "prefill_steps": len(prefill),
        "decode_steps": len(decode),
    }


def offline_cost_lines(header: StepLogStart, steps: Sequence[StepRecord]) -> dict[str, float]:
    """The paper's two lines as an offline profiling run gives them: the all-step fit
    (mixed steps included: a run of stock V1 has almost no pure prefill steps) read over
    typical batches, as the simulator reads a profile (`CostProfile.prior`)."""
    fit = fit_step_costs(steps)
    document = profile_document(fit, header.limits, "offline", "the capacity run")
    return profile_from_document(document).prior().coefficients()


async def _serve_policy(
    options: VllmBenchOptions,
    policy: str,
    entries: Sequence[TraceEntry],
    rate: float,
    log: Path,
    cost_prior: dict[str, float] | None,
    reference: dict,
) -> ReplayResult:
    settings = EngineSettings(model=options.model, policy=policy, step_log=log)
    if cost_prior:
        settings = replace(settings, cost_model="fixed", cost_prior=cost_prior)
    engine = await VllmRuntime.start(settings)
    try:
        await replay(engine, entries[:2], None)  # warm-up: first steps pay one-off costs
        check_speed(reference, read_step_log(log)[1])
        return await replay(engine, entries, rate)
    finally:
        engine.shutdown()


async def _find_epoch(
    options: VllmBenchOptions, checkpoint: Checkpoint, trace: TraceConfig
) -> tuple[Epoch, ReplayResult | None, dict[int, float]]:
    """The epoch whose machine speed this machine matches (its warm-up steps priced by
    each epoch's capacity-run fit), or a new one: capacity measured here, in the same
    engine. Returns the capacity run too when there was one, and the speeds compared."""
    epochs = checkpoint.epochs()
    entries = generate_relqueries(trace, load_datasets(options.datasets_dir))
    log = checkpoint.capacity_log_path(len(epochs))
    discard_step_log(log)  # an interrupted attempt's; the engine appends
    engine = await VllmRuntime.start(
        EngineSettings(model=options.model, policy="v1-fcfs", step_log=log)
    )
    try:
        await replay(engine, entries[:2], None)
        speeds = warm_up_speeds(epochs, read_step_log(log)[1])
        matched = matching_epoch(epochs, speeds)
        if matched is not None:
            log.unlink()
            return matched, None, speeds
        run = await replay(engine, entries, None)
    finally:
        engine.shutdown()
    capacity = len(entries) / (run.window[1] - run.window[0])
    epoch = checkpoint.save_epoch(capacity, trace, machine_description(), speeds)
    compress_step_log(log)
    return epoch, run, speeds


def runs_to_do(options: VllmBenchOptions) -> int:
    """Runs of the cells no epoch has finished (some may be done in this one already)."""
    checkpoint = Checkpoint(options.out_dir, resume=True) if options.resume else None
    return sum(
        len(options.policies)
        for trace in options.traces()
        for load in options.loads_for(trace)
        if checkpoint is None or not checkpoint.cell_done(trace, load, options.policies)
    )


def alternated(policies: Sequence[str], cell: int) -> list[str]:
    """The order the policies run in a campaign's `cell`-th cell: rotated one place each
    cell, so that no policy always runs first after a cell's change of trace or load."""
    shift = cell % len(policies)
    return [*policies[shift:], *policies[:shift]]


def run_vllm_benchmark(
    options: VllmBenchOptions, on_run: Callable[[str], None] | None = None
) -> None:
    """Every cell (trace, load) of the campaign not yet finished in some epoch, each
    policy in its own engine, checkpointed as it goes. The report reads the checkpoint."""
    say = on_run or (lambda _message: None)
    checkpoint = Checkpoint(options.out_dir, options.resume)
    datasets = load_datasets(options.datasets_dir)
    traces = options.traces()
    capacity_trace = checkpoint.capacity_trace(traces[0])
    epoch, capacity_run, speeds = asyncio.run(_find_epoch(options, checkpoint, capacity_trace))
    if capacity_run is not None:
        checkpoint.save_outputs(capacity_trace, capacity_run.output_tokens)
    compared = ", ".join(f"{speed:.2f}x epoch {n}'s" for n, speed in speeds.items())
    say(
        f"epoch {epoch.number}{' (new)' if capacity_run else ''}: capacity "
        f"{epoch.capacity:.4f} relQueries/s; warm-up steps took {compared or 'no'} fit"
    )
    capacity_log = read_step_log(epoch.capacity_log)
    offline_fit = offline_cost_lines(*capacity_log)
    reference = fit_step_costs(capacity_log[1])
    cells = [(trace, load) for trace in traces for load in options.loads_for(trace)]
    entries_of = {trace_name(trace): generate_relqueries(trace, datasets) for trace in traces}
    for number, (trace, load) in enumerate(cells):
        if checkpoint.cell_done(trace, load, options.policies):
            continue
        entries = entries_of[trace_name(trace)]
        for policy in alternated(options.policies, number):
            if checkpoint.has_run(policy, trace, load, epoch.number):
                continue
            name = f"steps-{policy}-{trace_name(trace)}-{load:g}-e{epoch.number}.jsonl"
            log = options.out_dir / name
            discard_step_log(log)
            prior = offline_fit if policy in FIXED_COST_POLICIES else None
            run = asyncio.run(
                _serve_policy(
                    options, policy, entries, load * epoch.capacity, log, prior, reference
                )
            )
            checkpoint.save_outputs(trace, run.output_tokens)
            record = _record(policy, trace, load, run, read_step_log(log)[1], prior, reference)
            record.update(epoch=epoch.number, capacity=epoch.capacity, step_log=name)
            checkpoint.add_runs([record])
            compress_step_log(log)
            say(
                f"{policy} {trace_name(trace)} at {load:g} of capacity: mean {record['mean']:.2f} s"
            )


def _record(
    policy: str,
    trace: TraceConfig,
    load: float,
    run: ReplayResult,
    steps,
    cost_prior: dict[str, float] | None,
    reference: dict,
) -> dict:
    window = [s for s in steps if run.window[0] <= s.t <= run.window[1]]
    stats = step_stats(window)
    summary = summarize_outcomes(
        policy,
        load,
        run.outcomes,
        [s.decision_s + s.adapter_s for s in window],
        makespan=run.window[1] - run.window[0],
        steps=stats["steps"],
        cost_coefficients=cost_prior or {},
        preemptions=0,
    )
    return {
        **summary.as_dict(),
        "cost_model": "fixed" if cost_prior else "online",
        "seed": trace.seed,
        "arrival": trace.arrival,
        "row_errors": run.row_errors,
        "step_stats": stats,
        "window": list(run.window),
        "machine": machine_description(),  # a campaign may span sessions and machines
        "speed_vs_capacity_run": speed_against(reference, window),
    }


def run_windows(records: Sequence[dict], steps: Sequence[StepRecord]) -> list[tuple[float, float]]:
    """Each record's window (monotonic start, end) in the step log of its engine, in the
    records' order. Records that predate the stored `window` get theirs from the log: an
    engine serves its loads back to back in rising order, so walking back from its last
    step by each run's makespan finds them (this reproduces every older record's step
    count to within the one step at a boundary)."""
    derived: dict[int, tuple[float, float]] = {}
    end = steps[-1].t if steps else 0.0
    for index in sorted(range(len(records)), key=lambda i: -records[i]["rate"]):
        derived[index] = (end - records[index]["makespan"], end)
        end = derived[index][0]
    return [
        tuple(record["window"]) if "window" in record else derived[index]
        for index, record in enumerate(records)
    ]


def mean_overhead_fraction(runs: Sequence[dict], policy: str) -> float:
    """Scheduling overhead as a share of busy step time, over all of a policy's runs."""
    mine = [r["step_stats"] for r in runs if r["policy"] == policy]
    busy = sum(s["busy_s"] for s in mine)
    return sum(s["scheduling_overhead_s"] for s in mine) / busy if busy else float("nan")
