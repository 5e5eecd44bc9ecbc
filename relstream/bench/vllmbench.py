"""`relstream bench --backend vllm`: the paper-style trace on the real engine, as a
campaign that can decide between policies.

Capacity is measured first: the first trace submitted all at once to stock vLLM V1
(`v1-fcfs`), relQueries divided by the time to answer them all, i.e. the throughput of
the engine kept saturated. Every load is a fraction of it, so the same command means the
same on any machine. Traces differ by arrival process (Poisson, bursty gamma) and seed;
the loads in `seeded_loads` run on every seed, the others on the first. Each policy runs
in its own engine per trace, with a step log; every finished (policy, trace) is
checkpointed, so a campaign of hours resumes where it stopped (`resume`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from relstream.backend import RelQueryBackend
from relstream.bench.report import machine_description
from relstream.bench.runner import Measured, summarize_outcomes
from relstream.bench.stepfit import fit_step_costs, profile_document
from relstream.bench.workload import TraceConfig, TraceEntry, generate_relqueries, load_datasets
from relstream.engine.runtime import EngineSettings, RelQueryEngine
from relstream.sim.profiles import fit_line, profile_from_document

# relserve runs as the paper runs it: step-cost lines fitted offline, here from the
# capacity run's steps (`offline_cost_lines`), and kept. Its online refit (recursive
# least squares, no context term) swung on real steps at overload (alpha_d 0-15 ms,
# beta_d 26-257 ms), where the simulator's exact step times hold it still (notes.md).
FIXED_COST_POLICIES = frozenset({"relserve"})

# Loads are fractions of the capacity measured on the machine that started the campaign.
# A campaign resumed on a machine whose steps run at another speed would run other loads
# than it says: machines of one kind here have differed 2.5x per step. Each engine's
# warm-up steps, priced by the capacity run's step-cost fit, must land within this band
# (the campaign's own engines: 0.94-1.27).
SPEED_BAND = (0.7, 1.4)


class MachineSpeedError(RuntimeError):
    """This machine's steps run too far from the speed of the capacity run's machine."""


def speed_against(reference: dict, steps: Sequence[dict]) -> float:
    """Real step time over the time `reference` (a `fit_step_costs` result) predicts for
    the same steps: above 1, this machine is slower than the one the fit came from."""
    predicted = sum(
        reference["base"]
        + reference["per_uncached_token"] * s["uncached_tokens"]
        + reference["per_decode_request"] * s["decode_requests"]
        + reference["per_context_token"] * s["decode_context_tokens"]
        for s in steps
    )
    return sum(s["duration_s"] for s in steps) / predicted if predicted else float("nan")


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


def offline_cost_lines(header: dict, steps: Sequence[dict]) -> dict[str, float]:
    """The paper's two lines as an offline profiling run gives them: the all-step fit
    (mixed steps included: a run of stock V1 has almost no pure prefill steps) read over
    typical batches, as the simulator reads a profile (`CostProfile.prior`)."""
    fit = fit_step_costs(steps)
    document = profile_document(fit, header["limits"], "offline", "the capacity run")
    return profile_from_document(document).prior().coefficients()


async def _serve_policy(
    options: VllmBenchOptions,
    policy: str,
    entries: Sequence[TraceEntry],
    rates: Sequence[float | None],
    log: Path,
    cost_prior: dict[str, float] | None = None,
    reference: dict | None = None,
) -> list[ReplayResult]:
    settings = EngineSettings(model=options.model, policy=policy, step_log=log)
    if cost_prior:
        settings = replace(settings, cost_model="fixed", cost_prior=cost_prior)
    engine = await RelQueryEngine.start(settings)
    try:
        await replay(engine, entries[:2], None)  # warm-up: first steps pay one-off costs
        if reference is not None:
            check_speed(reference, read_step_log(log)[1])
        return [await replay(engine, entries, rate) for rate in rates]
    finally:
        engine.shutdown()


def check_speed(reference: dict, warm_up_steps: Sequence[dict]) -> None:
    if not warm_up_steps:
        return
    speed = speed_against(reference, warm_up_steps)
    low, high = SPEED_BAND
    if not low <= speed <= high:
        raise MachineSpeedError(
            f"this machine's warm-up steps took {speed:.2f}x the time the capacity run's "
            f"step costs predict (allowed {low}-{high}x): its loads would not be the "
            "fractions of capacity the campaign says. Resume on the kind of machine that "
            "measured capacity, or start a new campaign here (without --resume)."
        )


def trace_name(trace: TraceConfig) -> str:
    return f"{trace.arrival}-s{trace.seed}"


class Checkpoint:
    """What a campaign has finished, on disk in its out_dir, so an interrupted campaign
    (a session ends, a machine restarts) resumes where it stopped: the capacity, every
    finished run (one JSON line each), and each trace's real output lengths."""

    def __init__(self, out: Path, resume: bool) -> None:
        self.out = out
        self.runs_path = out / "runs.jsonl"
        out.mkdir(parents=True, exist_ok=True)
        if not resume:
            for path in (*out.glob("steps-*.jsonl"), *out.glob("outputs-*.json")):
                path.unlink()
            self.runs_path.unlink(missing_ok=True)
            (out / "capacity.json").unlink(missing_ok=True)

    def capacity(self) -> float | None:
        path = self.out / "capacity.json"
        return json.loads(path.read_text())["relqueries_per_s"] if path.exists() else None

    def save_capacity(self, capacity: float, trace: TraceConfig) -> None:
        document = {"relqueries_per_s": capacity, "trace": asdict(trace)}
        (self.out / "capacity.json").write_text(json.dumps(document, indent=2) + "\n")

    def runs(self) -> list[dict]:
        if not self.runs_path.exists():
            return []
        return [json.loads(line) for line in self.runs_path.read_text().splitlines() if line]

    def done(self, policy: str, trace: TraceConfig) -> bool:
        return any(
            r["policy"] == policy and r["arrival"] == trace.arrival and r["seed"] == trace.seed
            for r in self.runs()
        )

    def add_runs(self, records: list[dict]) -> None:
        with self.runs_path.open("a") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")

    def save_outputs(self, trace: TraceConfig, output_tokens: dict[str, list[int]]) -> None:
        path = self.out / f"outputs-{trace_name(trace)}.json"
        if not path.exists():
            path.write_text(json.dumps(output_tokens) + "\n")


def run_vllm_benchmark(
    options: VllmBenchOptions, on_run: Callable[[str], None] | None = None
) -> None:
    """Every (policy, trace, load) of the campaign on the real engine, each policy in its
    own engine per trace, checkpointed as it goes. The report reads the checkpoint."""
    say = on_run or (lambda _message: None)
    checkpoint = Checkpoint(options.out_dir, options.resume)
    datasets = load_datasets(options.datasets_dir)
    traces = options.traces()
    capacity = checkpoint.capacity()
    if capacity is None:
        entries = generate_relqueries(traces[0], datasets)
        log = options.out_dir / "steps-capacity.jsonl"
        (run,) = asyncio.run(_serve_policy(options, "v1-fcfs", entries, [None], log))
        capacity = len(entries) / (run.window[1] - run.window[0])
        checkpoint.save_capacity(capacity, traces[0])
        checkpoint.save_outputs(traces[0], run.output_tokens)
    say(f"capacity {capacity:.4f} relQueries/s")
    capacity_log = read_step_log(options.out_dir / "steps-capacity.jsonl")
    offline_fit = offline_cost_lines(*capacity_log)
    reference = fit_step_costs(capacity_log[1])
    for trace in traces:
        entries = generate_relqueries(trace, datasets)
        loads = options.loads_for(trace)
        for policy in options.policies:
            if checkpoint.done(policy, trace):
                continue
            log = options.out_dir / f"steps-{policy}-{trace_name(trace)}.jsonl"
            log.unlink(missing_ok=True)
            rates = [load * capacity for load in loads]
            prior = offline_fit if policy in FIXED_COST_POLICIES else None
            runs = asyncio.run(
                _serve_policy(options, policy, entries, rates, log, prior, reference)
            )
            checkpoint.save_outputs(trace, runs[0].output_tokens)
            _, steps = read_step_log(log)
            records = [
                _record(policy, trace, load, run, steps, prior, reference)
                for load, run in zip(loads, runs, strict=True)
            ]
            checkpoint.add_runs(records)
            for record in records:
                say(
                    f"{policy} {trace_name(trace)} at {record['rate']:g} of capacity: "
                    f"mean {record['mean']:.2f} s"
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
    window = [s for s in steps if run.window[0] <= s["t"] <= run.window[1]]
    stats = step_stats(window)
    summary = summarize_outcomes(
        policy,
        load,
        run.outcomes,
        [s["decision_s"] + s["adapter_s"] for s in window],
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


def run_windows(records: Sequence[dict], steps: Sequence[dict]) -> list[tuple[float, float]]:
    """Each record's window (monotonic start, end) in the step log of its engine, in the
    records' order. Records that predate the stored `window` get theirs from the log: an
    engine serves its loads back to back in rising order, so walking back from its last
    step by each run's makespan finds them (this reproduces every older record's step
    count to within the one step at a boundary)."""
    derived: dict[int, tuple[float, float]] = {}
    end = steps[-1]["t"] if steps else 0.0
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
