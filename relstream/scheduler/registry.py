"""Every policy by name, and who decides its steps inside vLLM.

`v1-fcfs` and `v1-priority` are what stock vLLM V1 does on its own (its "fcfs" and
"priority" scheduling policies): inside vLLM the plug-in only observes them, so they are
the honest baselines, and on the simulator `stock_v1` models them. relstream's plug-in
decides every step of every other policy. The product holds those two and relstream's
own; others (the paper's baselines, in the lab) join with `register`, which the lab calls
when imported and which the `relstream.policies` entry point group calls from any
process that meets a name it does not know. On the simulator every policy runs as a
`Policy` object.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from importlib.metadata import entry_points

from relstream.scheduler.fairshare import FairShare
from relstream.scheduler.paperlines import CostModel
from relstream.scheduler.policies import Policy
from relstream.scheduler.relstream_policy import Relstream, RelstreamConfig
from relstream.scheduler.stock_v1 import MODELLED_VLLM, V1Fcfs, V1Priority


class VllmQueue(StrEnum):
    """vLLM's own `scheduling_policy` values."""

    FCFS = "fcfs"
    PRIORITY = "priority"  # a heap on (priority, arrival); requests carry static_priority


@dataclass(frozen=True)
class PolicySpec:
    name: str
    build: Callable[..., Policy]  # (cost) -> the policy; stock V1's also take vllm_version
    # Set when stock vLLM decides this policy's steps itself with that queue; None when
    # relstream's plug-in decides every step.
    decided_by_vllm: VllmQueue | None = None

    @property
    def vllm_queue(self) -> VllmQueue:
        """The queue vLLM keeps its waiting requests in for this policy."""
        return self.decided_by_vllm or VllmQueue.FCFS


_SPECS = (
    PolicySpec(V1Fcfs.name, V1Fcfs, VllmQueue.FCFS),
    PolicySpec(V1Priority.name, V1Priority, VllmQueue.PRIORITY),
    PolicySpec(Relstream.name, Relstream),
)
POLICIES: dict[str, PolicySpec] = {spec.name: spec for spec in _SPECS}
DEFAULT_POLICY = Relstream.name  # what `relstream engine`, the demo and the benchmarks run


ENTRY_POINTS = "relstream.policies"  # each names a function that calls `register`


def register(spec: PolicySpec) -> None:
    """Add a policy by its name; the same spec twice is one registration."""
    known = POLICIES.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"policy {spec.name!r} is registered already")
    POLICIES[spec.name] = spec


@functools.cache
def import_registered() -> None:
    """Call every `relstream.policies` entry point once (the lab's, where installed)."""
    for entry in entry_points(group=ENTRY_POINTS):
        try:
            entry.load()()
        except ImportError:
            continue  # its package is not installed here; the name stays unknown


def policy_spec(name: str) -> PolicySpec:
    if name not in POLICIES:
        import_registered()
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(POLICIES)
        raise ValueError(
            f"unknown policy {name!r}; choose one of: {known} (the paper's baselines, such "
            "as relserve, come with the lab: pip install 'relstream[lab]', from a "
            "checkout pip install '.[lab]')"
        ) from None


def queue_conflict(name: str, queue: str) -> str | None:
    """Why vLLM's `scheduling_policy` `queue` cannot go with policy `name` (None: it can).
    A policy the plug-in decides orders requests itself on vLLM's FCFS queue, so vLLM's
    priority queue under it would be accepted and silently ignored."""
    spec = policy_spec(name)
    if spec.decided_by_vllm is not None or queue == spec.vllm_queue:
        return None
    return (
        f"vLLM's scheduling_policy={queue!r} has no effect under policy {name!r}, which "
        f"orders requests itself: choose policy {V1Priority.name!r} for vLLM's priority "
        f"queue, or leave scheduling_policy at {spec.vllm_queue.value!r}"
    )


def holds_twins(name: str) -> bool:
    """Whether identical requests of different relQueries are each sent under their own
    relQuery (`SeqInfo.share`): where relstream's plug-in decides every step it runs one
    and holds the others; stock vLLM's own queues cannot hold one, so under `v1-fcfs`
    and `v1-priority` a later relQuery's row follows the request in flight instead.
    Policies only the simulator knows (the clairvoyant reference) hold them too."""
    spec = POLICIES.get(name)
    return spec is None or spec.decided_by_vllm is None


def make_policy(
    name: str,
    cost: CostModel,
    vllm_version: tuple[int, int] = MODELLED_VLLM,
    fair_weights: dict[str, float] | None = None,
) -> Policy:
    """The policy; stock V1's as release `vllm_version` schedules (the simulator models
    the one installed unless told); `fair_weights`: fair share between queries on, with
    these weights (relstream's own, `fairshare`)."""
    spec = policy_spec(name)
    if fair_weights is not None:
        check_fair_share(name, fair_weights)
        return Relstream(cost, RelstreamConfig(fair_weights=dict(fair_weights)))
    if spec.decided_by_vllm is None:
        return spec.build(cost)
    return spec.build(cost, vllm_version=vllm_version)


def check_fair_share(name: str, weights: dict[str, float] | None) -> None:
    """Fair share between queries is relstream's (`fairshare`): raises where `weights`
    (None: off) are given to another policy, or one is not positive."""
    if weights is None:
        return
    FairShare(weights)  # raises, naming a query whose weight is not positive
    if policy_spec(name).build is not Relstream:
        raise ValueError(
            f"fair share between queries needs policy {Relstream.name!r}; {name!r} has none"
        )
