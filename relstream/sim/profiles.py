"""Step-cost profiles: how long the simulated engine takes for a batch.

A profile is ground truth for the simulator only. The scheduler never reads it: it
sees the executed steps and fits its own linear model (or is handed `prior()`). Named
profiles are data files under `data/` (their derivation or their source run is written
in them); the real-engine benchmark writes a new fitted file beside its results.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from relstream.scheduler.data import EngineLimits
from relstream.scheduler.paperlines import CostModel, Linear


@dataclass(frozen=True)
class CostProfile(ABC):
    name: str
    limits: EngineLimits

    @abstractmethod
    def step_time(self, uncached_tokens: int, decode_requests: int, context_tokens: int) -> float:
        """Seconds for one step computing `uncached_tokens` prompt tokens and one token
        for each of `decode_requests` requests holding `context_tokens` of KV."""

    def prior(self) -> CostModel:
        """Least-squares line through the profile over typical batches."""
        prefill_points = [(n, self.step_time(n, 0, 0)) for n in (128, 256, 512, 1024, 2048)]
        typical_context = 256
        decode_points = [(n, self.step_time(0, n, n * typical_context)) for n in (4, 8, 16, 32, 64)]
        return CostModel(fit_line(prefill_points), fit_line(decode_points))


def fit_line(points: list[tuple[float, float]]) -> Linear:
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    return Linear(slope, mean_y - slope * mean_x)


@dataclass(frozen=True)
class RooflineProfile(CostProfile):
    """Step time = overhead + max(compute time, memory time) on one accelerator.

    compute = (uncached + decode) tokens × FLOPs per token / sustained FLOP/s
    memory  = (weights + KV of the decoding contexts) bytes / sustained bandwidth
    """

    flops_per_token: float
    weight_bytes: float
    kv_bytes_per_token: float
    sustained_flops: float
    sustained_bandwidth: float
    overhead: float

    def step_time(self, uncached_tokens: int, decode_requests: int, context_tokens: int) -> float:
        compute = (uncached_tokens + decode_requests) * self.flops_per_token / self.sustained_flops
        traffic = self.weight_bytes + context_tokens * self.kv_bytes_per_token
        return self.overhead + max(compute, traffic / self.sustained_bandwidth)


@dataclass(frozen=True)
class LinearProfile(CostProfile):
    """Fitted straight lines (the paper's form) with an optional context term."""

    prefill_per_token: float
    prefill_base: float
    decode_per_request: float
    decode_base: float
    decode_per_context_token: float = 0.0

    def step_time(self, uncached_tokens: int, decode_requests: int, context_tokens: int) -> float:
        base, prefill, decode, context = self.terms(
            uncached_tokens, decode_requests, context_tokens
        )
        return base + prefill + (decode + context)

    def terms(
        self, uncached_tokens: int, decode_requests: int, context_tokens: int
    ) -> tuple[float, float, float, float]:
        """A step's seconds by term: its base (the larger of the two kinds it runs), its
        prompt tokens, its decodes and their context."""
        base = max(
            self.prefill_base if uncached_tokens else 0.0,
            self.decode_base if decode_requests else 0.0,
        )
        return (
            base,
            self.prefill_per_token * uncached_tokens,
            self.decode_per_request * decode_requests,
            self.decode_per_context_token * context_tokens,
        )


def roofline_from_document(document: dict[str, Any]) -> RooflineProfile:
    return RooflineProfile(
        name=document["name"],
        limits=EngineLimits(**document["limits"]),
        flops_per_token=document["flops_per_token"],
        weight_bytes=document["weight_bytes"],
        kv_bytes_per_token=document["kv_bytes_per_token"],
        sustained_flops=document["flops_efficiency"] * document["peak_flops"],
        sustained_bandwidth=document["bandwidth_efficiency"] * document["peak_bandwidth"],
        overhead=document["overhead"],
    )


def linear_from_document(document: dict[str, Any]) -> LinearProfile:
    return LinearProfile(
        name=document["name"],
        limits=EngineLimits(**document["limits"]),
        prefill_per_token=document["prefill_per_token"],
        prefill_base=document["prefill_base"],
        decode_per_request=document["decode_per_request"],
        decode_base=document["decode_base"],
        decode_per_context_token=document.get("decode_per_context_token", 0.0),
    )


_READERS = {"roofline": roofline_from_document, "linear": linear_from_document}
PROFILE_NAMES = ("a100-opt13b", "h100-llama8b", "cpu-smollm2")


def profile_document(name: str) -> dict[str, Any]:
    """The data file of a named profile (package data under `relstream/sim/data/`)."""
    if name not in PROFILE_NAMES:
        raise ValueError(
            f"unknown cost profile {name!r}; choose one of: {', '.join(PROFILE_NAMES)}"
        )
    text = resources.files(__package__).joinpath("data", f"{name}.json").read_text()
    return json.loads(text)


def profile_from_document(document: dict[str, Any]) -> CostProfile:
    try:
        reader = _READERS[document["kind"]]
    except KeyError:
        raise ValueError(f"profile kind must be one of {', '.join(_READERS)}") from None
    return reader(document)


@cache
def get_profile(name: str) -> CostProfile:
    return profile_from_document(profile_document(name))
