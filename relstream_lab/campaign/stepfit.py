"""Step costs fitted from real step logs, every step kind at once.

One least-squares line over all steps (prefill, decode and V1's mixed steps):

    duration = base + per_uncached_token · uncached tokens + per_decode · decode requests
               + per_context_token · KV tokens the decodes attend to

The paper fits prefill and decode separately (its V0 engine never mixed them); V1 mixes
prefill chunks into decode steps, so the mixed steps must be in the fit.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from relstream.scheduler.stepcost import nonnegative_lstsq
from relstream.scheduler.steprecord import StepRecord

FEATURES = ("uncached_tokens", "decode_requests", "decode_context_tokens")


def fit_step_costs(steps: Sequence[StepRecord]) -> dict:
    """Coefficients (seconds) and how well they explain the steps they came from."""
    usable = list(steps)
    if len(usable) < len(FEATURES) + 1:
        raise ValueError(f"{len(usable)} step records with {', '.join(FEATURES)}: too few")
    design = np.array([[1.0, *(getattr(s, f) for f in FEATURES)] for s in usable])
    durations = np.array([s.duration_s for s in usable])
    coefficients = nonnegative_lstsq(design, durations)
    predicted = design @ coefficients
    base, per_token, per_decode, per_context = (float(c) for c in coefficients)
    by_kind: dict[str, dict[str, float]] = {}
    for kind in sorted({s.kind.value for s in usable}):
        mask = np.array([s.kind.value == kind for s in usable])
        by_kind[kind] = {
            "steps": int(mask.sum()),
            "busy_ratio": float(predicted[mask].sum() / durations[mask].sum()),
            "mean_abs_error": float(
                np.mean(np.abs(predicted[mask] - durations[mask]) / durations[mask])
            ),
        }
    return {
        "base": base,
        "per_uncached_token": per_token,
        "per_decode_request": per_decode,
        "per_context_token": per_context,
        "steps": len(usable),
        "busy_ratio": float(predicted.sum() / durations.sum()),  # predicted / real busy time
        "by_kind": by_kind,
    }


def profile_document(fit: dict, limits: dict, name: str, source: str) -> dict:
    """The fit as a simulator profile (`relstream.sim.profiles`, kind "linear")."""
    return {
        "name": name,
        "kind": "linear",
        "description": "fitted by `relstream-lab bench campaign` from its step logs, all "
        "step kinds at once: base + per uncached token + per decode + per context token.",
        "source": source,
        "limits": limits,
        "prefill_per_token": fit["per_uncached_token"],
        "prefill_base": fit["base"],
        "decode_per_request": fit["per_decode_request"],
        "decode_base": fit["base"],
        "decode_per_context_token": fit["per_context_token"],
        "fitted_from": {"steps": fit["steps"], "busy_ratio": fit["busy_ratio"]},
    }
