"""The paper's baseline policies (vLLM V0's, Sarathi, RelServe and its ablations) and the
mechanisms only they use (PEM, DPU, ABA, V0-style batches). `register` adds them to the
product's policy registry: the lab calls it when imported, and the `relstream.policies`
entry point calls it in any process that meets one of their names."""

from __future__ import annotations

from relstream.scheduler.registry import PolicySpec
from relstream.scheduler.registry import register as register_spec
from relstream_lab.baselines.v0 import (
    RelServe,
    RelServeDP,
    RelServePP,
    Sarathi,
    V0Fcfs,
    V0Sp,
    V0SpEvict,
)

BASELINES = (
    V0Fcfs,
    V0Sp,
    V0SpEvict,
    Sarathi,
    RelServe,
    RelServePP,
    RelServeDP,
)


def register() -> None:
    """Every baseline into the registry, relstream's plug-in deciding its steps."""
    for policy in BASELINES:
        register_spec(PolicySpec(policy.name, policy))
