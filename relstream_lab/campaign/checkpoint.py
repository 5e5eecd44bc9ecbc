"""What a real-engine campaign has measured, kept on disk so that it can span sessions
and machines.

A campaign's loads are fractions of a capacity measured on one machine, and its policies
are compared at each (trace, load), a *cell*. Sessions land on machines whose vLLM steps
run at different speeds (2-4x apart here), so a campaign is cut into *epochs*: an epoch
is one machine speed with its own capacity run. A resumed campaign prices its first
engine's warm-up steps by each epoch's capacity-run fit and continues the epoch that
matches (within `SPEED_BAND`), or measures capacity anew and opens the next one. A cell
is finished when one epoch holds a run of every policy; every ratio is taken inside one
epoch, never across machines.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from relstream.scheduler.steprecord import StepRecord, compressed_path, read_step_log
from relstream_lab.campaign.stepfit import fit_step_costs
from relstream_lab.common.workload import TraceConfig

# Loads mean a fraction of the capacity of the machine that runs them. An engine whose
# warm-up steps, priced by its epoch's capacity-run fit, land outside this band runs on
# another machine speed (one epoch's own engines ran at 0.94-1.27).
SPEED_BAND = (0.7, 1.4)


class MachineSpeedError(RuntimeError):
    """This machine's steps run too far from the speed of its epoch's capacity run."""


def speed_against(reference: dict, steps: Sequence[StepRecord]) -> float:
    """Real step time over the time `reference` (a `fit_step_costs` result) predicts for
    the same steps: above 1, this machine is slower than the one the fit came from."""
    predicted = sum(
        reference["base"]
        + reference["per_uncached_token"] * s.uncached_tokens
        + reference["per_decode_request"] * s.decode_requests
        + reference["per_context_token"] * s.decode_context_tokens
        for s in steps
    )
    return sum(s.duration_s for s in steps) / predicted if predicted else float("nan")


def within_band(speed: float) -> bool:
    low, high = SPEED_BAND
    return low <= speed <= high


def check_speed(reference: dict, warm_up_steps: Sequence[StepRecord]) -> None:
    if not warm_up_steps:
        return
    speed = speed_against(reference, warm_up_steps)
    if not within_band(speed):
        low, high = SPEED_BAND
        raise MachineSpeedError(
            f"this machine's warm-up steps took {speed:.2f}x the time its epoch's capacity "
            f"run predicts (allowed {low}-{high}x): the machine changed speed during the "
            "campaign. Resume it: the next epoch measures capacity on this machine."
        )


def compress_step_log(path: Path) -> Path:
    """Gzip a finished run's step log in place of the plain one (the engine writes plain
    JSON lines while it runs; `read_step_log` reads either), so the logs a report reads
    weigh little in the repository. Returns the compressed file."""
    target = compressed_path(path)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(gzip.compress(path.read_bytes(), compresslevel=9, mtime=0))
    partial.replace(target)
    path.unlink()
    return target


def discard_step_log(path: Path) -> None:
    """Remove an earlier attempt's step log, plain or compressed (the engine appends)."""
    path.unlink(missing_ok=True)
    compressed_path(path).unlink(missing_ok=True)


def trace_name(trace: TraceConfig) -> str:
    return f"{trace.arrival}-s{trace.seed}"


@dataclass(frozen=True)
class Epoch:
    number: int
    capacity: float  # relQueries/s, measured on this epoch's machine
    capacity_log: Path  # the capacity run's step log
    machine: str = "not recorded"  # what ran it (the first epoch's capacity file lacks it)

    @property
    def profile_file(self) -> str:
        """The simulator profile the report fits over this epoch's steps."""
        return f"fitted_profile-e{self.number}.json" if self.number else "fitted_profile.json"

    def reference(self) -> dict:
        """The capacity run's step-cost fit: what prices every later engine's steps."""
        return fit_step_costs(read_step_log(self.capacity_log)[1])


def warm_up_speeds(epochs: Sequence[Epoch], warm_up: Sequence[StepRecord]) -> dict[int, float]:
    """This machine's speed against each epoch's: `warm_up` steps priced by its fit."""
    return {epoch.number: speed_against(epoch.reference(), warm_up) for epoch in epochs}


def matching_epoch(epochs: Sequence[Epoch], speeds: dict[int, float]) -> Epoch | None:
    """The latest epoch whose machine speed this one matches (`warm_up_speeds`), if any."""
    for epoch in reversed(epochs):
        if within_band(speeds[epoch.number]):
            return epoch
    return None


def run_epoch(run: dict) -> int:
    return run.get("epoch", 0)  # runs from before epochs all ran in the first


def step_log_of(run: dict) -> str:
    """The step log of the engine that served `run` (before epochs: one per trace)."""
    return run.get("step_log") or f"steps-{run['policy']}-{run['arrival']}-s{run['seed']}.jsonl"


class Checkpoint:
    """What a campaign has finished, on disk in its out_dir, so an interrupted campaign
    (a session ends, a machine restarts) resumes where it stopped: each epoch's capacity,
    every finished run (one JSON line each), and each trace's real output lengths."""

    def __init__(self, out: Path, resume: bool) -> None:
        self.out = out
        self.runs_path = out / "runs.jsonl"
        out.mkdir(parents=True, exist_ok=True)
        if not resume:
            for path in (
                *out.glob("steps-*.jsonl"),
                *out.glob("steps-*.jsonl.gz"),
                *out.glob("outputs-*.json"),
                *out.glob("capacity*.json"),
            ):
                path.unlink()
            self.runs_path.unlink(missing_ok=True)

    # epochs
    def _capacity_path(self, number: int) -> Path:
        return self.out / ("capacity.json" if number == 0 else f"capacity-e{number}.json")

    def capacity_log_path(self, number: int) -> Path:
        name = "steps-capacity.jsonl" if number == 0 else f"steps-capacity-e{number}.jsonl"
        return self.out / name

    def epochs(self) -> list[Epoch]:
        found = []
        while (path := self._capacity_path(len(found))).exists():
            record = json.loads(path.read_text())
            log = self.capacity_log_path(len(found))
            machine = record.get("machine", Epoch.machine)
            found.append(Epoch(len(found), record["relqueries_per_s"], log, machine))
        return found

    def capacity_trace(self, default: TraceConfig) -> TraceConfig:
        """The trace every epoch measures capacity on: the first epoch's."""
        path = self._capacity_path(0)
        return TraceConfig(**json.loads(path.read_text())["trace"]) if path.exists() else default

    def save_epoch(
        self, capacity: float, trace: TraceConfig, machine: str, speeds: dict[int, float]
    ) -> Epoch:
        """A new epoch; `speeds` (`warm_up_speeds`) say why no earlier one matched."""
        number = len(self.epochs())
        document = {
            "relqueries_per_s": capacity,
            "trace": asdict(trace),
            "machine": machine,
            "warm_up_speed_vs_epochs": {str(n): round(v, 3) for n, v in speeds.items()},
        }
        self._capacity_path(number).write_text(json.dumps(document, indent=2) + "\n")
        return Epoch(number, capacity, self.capacity_log_path(number), machine)

    # runs
    def runs(self) -> list[dict]:
        """Every run on record, superseded ones included."""
        if not self.runs_path.exists():
            return []
        return [json.loads(line) for line in self.runs_path.read_text().splitlines() if line]

    def current_runs(self) -> list[dict]:
        """Runs that still count: not superseded (a policy changed after them)."""
        return [run for run in self.runs() if "superseded" not in run]

    def has_run(self, policy: str, trace: TraceConfig, load: float, epoch: int) -> bool:
        return any(
            _cell(run) == (trace.arrival, trace.seed, load)
            and run["policy"] == policy
            and run_epoch(run) == epoch
            for run in self.current_runs()
        )

    def cell_done(self, trace: TraceConfig, load: float, policies: Sequence[str]) -> bool:
        """Whether one epoch holds a run of every policy at this trace and load."""
        cell = (trace.arrival, trace.seed, load)
        return cell in finished_cells(self.current_runs(), policies)

    def add_runs(self, records: list[dict]) -> None:
        with self.runs_path.open("a") as handle:
            for record in records:
                handle.write(json.dumps(record) + "\n")

    def save_outputs(self, trace: TraceConfig, output_tokens: dict[str, list[int]]) -> None:
        path = self.out / f"outputs-{trace_name(trace)}.json"
        if not path.exists():
            path.write_text(json.dumps(output_tokens) + "\n")


def _cell(run: dict) -> tuple[str, int, float]:
    return run["arrival"], run["seed"], run["rate"]


def finished_cells(runs: Sequence[dict], policies: Sequence[str]) -> dict[tuple, int]:
    """Each cell some epoch has finished, with the latest such epoch."""
    held: dict[tuple, set[str]] = {}
    for run in runs:
        held.setdefault((*_cell(run), run_epoch(run)), set()).add(run["policy"])
    finished: dict[tuple, int] = {}
    for (*cell, epoch), names in held.items():
        if set(policies) <= names:
            finished[tuple(cell)] = max(epoch, finished.get(tuple(cell), epoch))
    return finished


def reported_runs(runs: Sequence[dict], policies: Sequence[str]) -> list[dict]:
    """The runs a report compares: per cell, those of the latest epoch that finished it,
    or of its latest epoch while none has (so no ratio mixes machines)."""
    current = [run for run in runs if "superseded" not in run]
    finished = finished_cells(current, policies)
    latest: dict[tuple, int] = {}
    for run in current:
        latest[_cell(run)] = max(run_epoch(run), latest.get(_cell(run), 0))
    chosen = {cell: finished.get(cell, latest[cell]) for cell in latest}
    return [run for run in current if run_epoch(run) == chosen[_cell(run)]]
