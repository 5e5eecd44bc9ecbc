"""A step as the plug-in logs it, and why the policy made it so: typed records, one JSON
line each, written by `engine/core/plugin.py` and read back by the benchmarks.

A step log starts with a `StepLogStart` line (the vLLM release, the scheduler class, the
policy, the limits and the cost prior), then holds one `StepRecord` a step: what it
computed (prompt tokens and the requests they belong to, decodes, the KV context each
side attends to), how long it took, the queue around it, and the policy's
`StepDecision`: whether the Δ gate planned it and held work back, the pressure it
weighed, and why V1's admission stopped (`admission.Stop`). Logs written before the
decision existed read back with none. A log kept once its run is over may be
gzip-compressed beside its plain name (`compressed_path`); it reads back the same.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import msgspec

from relstream.scheduler.admission import Stop
from relstream.scheduler.data import StepFeedback, StepKind


class StepDecision(msgspec.Struct, frozen=True, omit_defaults=True):
    """Why a step is what it is, as the policy decided it."""

    gated: bool = False  # planned through the Δ gate
    held: bool = False  # the gate held work back in it
    pressure: float = 0.0  # relQueries a lost second of capacity delays (headroom)
    stop: Stop | None = None  # why V1's admission stopped, where it ran


class StepRecord(msgspec.Struct, kw_only=True):
    """One executed step; every field is written, so a reader of plain JSON finds each.
    The enums are written as their values ("decode", "budget")."""

    kind: StepKind
    uncached_tokens: int
    decode_requests: int
    prefill_requests: int = 0
    decode_context_tokens: int = 0
    prefill_context_tokens: int = 0
    duration_s: float = 0.0  # set once the step's output is back
    decision_s: float = 0.0  # the policy's plan
    adapter_s: float = 0.0  # vLLM's schedule() enforcing it
    admitted: list[str] = msgspec.field(default_factory=list)  # relQueries, in order
    waiting: int = 0  # requests waiting and running after it
    running: int = 0
    held: int = 0  # twins held behind a running one, after it
    t: float = 0.0  # monotonic clock when it was reported
    decision: StepDecision | None = None

    def feedback(self, duration_s: float) -> StepFeedback:
        """What the cost fit learns from this step, timed at `duration_s`."""
        return StepFeedback(
            self.kind,
            self.uncached_tokens,
            self.decode_requests,
            duration_s,
            self.decode_context_tokens,
        )


class StepLogStart(msgspec.Struct, kw_only=True):
    """The first line of a step log."""

    event: str = "start"
    vllm: str = ""  # logs before vLLM's release was recorded have none
    scheduler: str = ""
    policy: str = ""
    limits: dict = msgspec.field(default_factory=dict)
    cost_model: str = ""
    cost_prior: dict = msgspec.field(default_factory=dict)


_encoder = msgspec.json.Encoder()
_start = msgspec.json.Decoder(StepLogStart)
_step = msgspec.json.Decoder(StepRecord)


def encode_line(record: StepRecord | StepLogStart) -> str:
    return _encoder.encode(record).decode() + "\n"


def compressed_path(path: Path) -> Path:
    """Where the gzip-compressed copy of the step log at `path` lives."""
    return path.with_name(path.name + ".gz")


def _log_bytes(path: Path) -> bytes:
    """The log's JSON lines: `path` itself (compressed if it ends in .gz), or its
    compressed copy when the plain log is gone."""
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes())
    if not path.exists() and compressed_path(path).exists():
        return gzip.decompress(compressed_path(path).read_bytes())
    return path.read_bytes()


def read_step_log(path: Path) -> tuple[StepLogStart | None, list[StepRecord]]:
    """The header (None if the log has none) and every step, in order, from the plain
    log at `path` or, once it is compressed, from `compressed_path(path)`."""
    header: StepLogStart | None = None
    steps: list[StepRecord] = []
    for line in _log_bytes(path).splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith(b'{"event"'):
            header = _start.decode(line)
        else:
            steps.append(_step.decode(line))
    return header, steps
