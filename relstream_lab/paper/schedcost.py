"""What a scheduling decision costs inside vLLM's own Scheduler, crowd by crowd.

vLLM's V1 `Scheduler` is built as its own tests build it (a VllmConfig over the local
model folder, a KVCacheConfig, no model run) and driven with fake model outputs, once
as stock vLLM (FCFS, no plug-in) and once with relstream's plug-in deciding every step.
The waiting crowd is N rows in relQueries of `rows_per_relquery`; each timed step is
`schedule()` plus `update_from_output()` (where the plug-in's tracker and cost fit
learn), on this machine's CPU. A GPU step of a 7-8B model takes about 10-30 ms, so the
report states each median and p99 as a share of a 10 ms and a 30 ms step.

    relstream-lab bench scheduler-cost --rows 1000,10000,100000 \
        --out docs/benchmarks/scheduler-cost
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

PROMPT = 64  # tokens of each row's prompt
OUTPUTS = 16  # tokens each row generates


@dataclass(frozen=True)
class Crowd:
    """How the waiting rows are cut into relQueries, the scheduler's limits, and the steps
    timed."""

    rows_per_relquery: int = 50
    max_num_seqs: int = 256
    budget: int = 2048
    blocks: int = 4096
    warm_up: int = 20
    steps: int = 200


def build(policy: str | None, max_num_seqs: int, budget: int, num_blocks: int):
    """A vLLM scheduler on the CPU platform: stock (policy None) or relstream's plug-in."""
    from relstream.engine.core.harness import build_scheduler
    from relstream.engine.weights import model_dir

    return build_scheduler(
        policy, model_folder=model_dir("smollm2"), max_num_seqs=max_num_seqs, budget=budget,
        num_blocks=num_blocks,
    )  # fmt: skip


def fill(scheduler, rows: int, rows_per_relquery: int) -> None:
    """`rows` waiting requests, `rows_per_relquery` to a relQuery, prompts all distinct."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    from relstream.engine.core.harness import BLOCK
    from relstream.engine.tags import relquery_tags

    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    for row in range(rows):
        relquery = f"q{row // rows_per_relquery}"
        size = min(rows_per_relquery, rows - row // rows_per_relquery * rows_per_relquery)
        params = SamplingParams(
            ignore_eos=True, max_tokens=OUTPUTS, extra_args=relquery_tags(relquery, size)
        )
        params.update_from_generation_config({}, 2)
        prompt = [(row * 31 + i) % 40_000 + 10 for i in range(PROMPT)]
        scheduler.add_request(
            Request(
                request_id=f"{relquery}-{row}",
                prompt_token_ids=prompt,
                sampling_params=params,
                pooling_params=None,
                block_hasher=hasher,
            )
        )


def time_steps(scheduler, steps: int) -> tuple[list[float], list[float]]:
    """Seconds of `schedule()` + `update_from_output()` per step, the model's time aside,
    and of the policy's own decision (`plan`) within it (none for stock vLLM)."""
    from relstream.engine.core.harness import fake_output

    timings: list[float] = []
    decisions: list[float] = []
    policy = getattr(scheduler, "relstream_policy", None)
    if policy is not None:
        plan = policy.plan

        def timed(view):
            start = time.perf_counter()
            try:
                return plan(view)
            finally:
                decisions.append(time.perf_counter() - start)

        policy.plan = timed
    for _ in range(steps):
        if not scheduler.has_unfinished_requests():
            break
        start = time.perf_counter()
        step = scheduler.schedule()
        planned = time.perf_counter() - start
        output = fake_output(scheduler, step)
        start = time.perf_counter()
        scheduler.update_from_output(step, output)
        timings.append(planned + time.perf_counter() - start)
    return timings, decisions


def measure(policy: str | None, rows: int, crowd: Crowd) -> dict:
    scheduler = build(policy, crowd.max_num_seqs, crowd.budget, crowd.blocks)
    started = time.perf_counter()
    fill(scheduler, rows, crowd.rows_per_relquery)
    filled = time.perf_counter() - started
    timings, decisions = time_steps(scheduler, crowd.warm_up + crowd.steps)
    ms = np.array(timings[crowd.warm_up :]) * 1000
    median, p99 = float(np.median(ms)), float(np.percentile(ms, 99, method="inverted_cdf"))
    plan_ms = np.array(decisions[crowd.warm_up :] or [np.nan]) * 1000
    return {
        "scheduler": f"relstream plug-in ({policy})" if policy else "stock vLLM V1 (fcfs)",
        "waiting_rows": rows,
        "steps": len(ms),
        "median_ms": median,
        "p99_ms": p99,
        "max_ms": float(ms.max()),
        "mean_ms": statistics.fmean(timings) * 1000,
        "fill_s": filled,
        "decision_median_ms": float(np.median(plan_ms)),
        "decision_p99_ms": float(np.percentile(plan_ms, 99, method="inverted_cdf")),
    }


def markdown(results: list[dict], command: str, machine: str, vllm_version: str) -> str:
    lines = [
        "# Scheduler cost per step inside vLLM's Scheduler",
        "",
        "Reproduce with:",
        "",
        f"```\n{command}\n```",
        "",
        f"Machine: {machine}; vLLM {vllm_version} (CPU platform, no model run: fake outputs).",
        f"Each step is `schedule()` + `update_from_output()` with {PROMPT}-token prompts and "
        f"{OUTPUTS} outputs a row, after the warm-up steps that fill the running batch.",
        "",
        "| scheduler | waiting rows | steps | median (ms) | p99 (ms) | max (ms) "
        "| median / 10 ms step | p99 / 10 ms | median / 30 ms | p99 / 30 ms "
        "| policy's decision: median, p99 (ms) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        shares = [
            f"{100 * r[key] / step:.1f} %" for step in (10, 30) for key in ("median_ms", "p99_ms")
        ]
        lines.append(
            f"| {r['scheduler']} | {r['waiting_rows']:,} | {r['steps']} | {r['median_ms']:.2f} "
            f"| {r['p99_ms']:.2f} | {r['max_ms']:.2f} | "
            + " | ".join(shares)
            + f" | {_decision(r)} |"
        )
    return "\n".join(lines) + "\n"


def _decision(result: dict) -> str:
    if np.isnan(result["decision_median_ms"]):
        return "— (vLLM decides)"
    return f"{result['decision_median_ms']:.2f}, {result['decision_p99_ms']:.2f}"


def run_schedcost(
    out: Path, crowds: tuple[int, ...], policy: str, crowd: Crowd, command: str
) -> None:
    """Stock vLLM and `policy`'s plug-in at each crowd of waiting rows: each result as a
    JSON line on stdout, then results.json and README.md in `out`."""
    import vllm

    results = []
    for rows in crowds:
        for each in (None, policy):
            results.append(measure(each, rows, crowd))
            print(json.dumps(results[-1]))
    machine = f"{platform.processor() or platform.machine()}, {platform.platform()}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "README.md").write_text(markdown(results, command, machine, vllm.__version__))
