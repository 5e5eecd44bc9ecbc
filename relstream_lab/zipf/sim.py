"""`relstream-lab bench zipf`: a stream that repeats itself, on the simulated engine.

Catalogue enrichment: each relQuery is a window of 1-48 rows of `ratebeer.csv`, and each
row classifies a beer from its name and style alone, so two rows of one beer are the
same request. Beers are drawn by a Zipf law (s = 1.0 by default) over the table's 355,
in a seeded order; windows arrive as a Poisson process at a fraction of the capacity
stock V1 reaches on the trace (its FCFS policy serving every relQuery at once).

Variants: stock V1 (`v1-fcfs`, `v1-priority`: rows in arrival order, prefix caching on,
nothing shared), then relstream with each mechanism added in turn: rows in prompt order,
identical requests in flight computed once, the answer cache. Greedy decoding, so one
beer's rows share one output length, drawn once per beer.
"""

from __future__ import annotations

import csv
import random
import statistics
from dataclasses import dataclass, replace
from itertools import accumulate
from pathlib import Path

from relstream.engine.tokenizer import chatml_prompt, encode_batch
from relstream.model import Template
from relstream.sim.kvcache import block_hashes
from relstream.sim.profiles import CostProfile
from relstream.sim.sharing import Sharing
from relstream.sim.simulator import SimRelQuery, SimRequest, SimRun, Simulator
from relstream_lab.common.runner import make_cost_model, percentile, run_pooled
from relstream_lab.common.workload import TraceConfig, unit_gaps
from relstream_lab.policies import make_sim_policy
from relstream_lab.sustained.run import ALL_AT_ONCE, load_profile, profile_label

TABLE = "ratebeer.csv"
TEMPLATE = (
    "Classify this beer from its name and style alone. Answer with one word: Light, "
    "Amber, Dark or Sour.\nBeer: {beer/name}\nStyle: {beer/style}"
)
MAX_TOKENS = 8
EOS_PER_TOKEN = 0.3  # a one-word answer ends after ~3 tokens, never past MAX_TOKENS
CACHE_ENTRIES = 100_000  # the real cache's 256 MB default holds every beer many times


@dataclass(frozen=True)
class Variant:
    policy: str
    prompt_order: bool  # rows reach the engine sorted by their prompts (relstream does)
    sharing: Sharing


VARIANTS = {
    "v1-fcfs": Variant("v1-fcfs", False, Sharing()),
    "v1-priority": Variant("v1-priority", False, Sharing()),
    "relstream, rows in arrival order": Variant("relstream", False, Sharing()),
    "relstream": Variant("relstream", True, Sharing()),
    "relstream + computed once": Variant("relstream", True, Sharing(dedup=True)),
    "relstream + computed once + answer cache": Variant(
        "relstream", True, Sharing(dedup=True, cache_entries=CACHE_ENTRIES)
    ),
}


@dataclass(frozen=True)
class ZipfOptions:
    datasets_dir: Path
    profiles: tuple[str, ...] = ("cpu-smollm2", "cpu-smollm2@16", "a100-opt13b")
    seeds: tuple[int, ...] = (0, 1, 2)
    load: float = 0.95
    relqueries: int = 300
    max_rows: int = 48
    zipf_s: float = 1.0
    workers: int = 2


def read_beers(datasets_dir: Path) -> list[dict[str, str]]:
    """The table's distinct beers (name and style), in order of first appearance."""
    beers: dict[str, dict[str, str]] = {}
    with (datasets_dir / TABLE).open(newline="") as handle:
        for record in csv.DictReader(handle):
            beers.setdefault(record["beer/name"], record)
    return list(beers.values())


def zipf_windows(options: ZipfOptions, seed: int, beers: int) -> list[list[int]]:
    """Each relQuery's rows as indices of the table's `beers` beers: window sizes uniform
    in 1..max_rows, beers by a Zipf law over a seeded ranking of them."""
    rng = random.Random(seed * 104_729 + 17)
    ranking = list(range(beers))
    rng.shuffle(ranking)
    weights = [1.0 / rank**options.zipf_s for rank in range(1, beers + 1)]
    return [
        rng.choices(ranking, weights, k=rng.randint(1, options.max_rows))
        for _ in range(options.relqueries)
    ]


def tokenized_beers(beers: list[dict[str, str]]) -> list[tuple[int, ...]]:
    """Every beer's prompt as the engine receives it, tokenized once."""
    template = Template(TEMPLATE)
    prompts = [template.render(beer) for beer in beers]
    return [tuple(ids) for ids in encode_batch([chatml_prompt(p) for p in prompts])]


def output_lengths(beers: int, seed: int) -> list[int]:
    """One length per beer (greedy: one beer, one answer), geometric, at most MAX_TOKENS."""
    rng = random.Random(seed * 7_919 + 3)
    lengths = []
    for _ in range(beers):
        length = 1
        while length < MAX_TOKENS and rng.random() >= EOS_PER_TOKEN:
            length += 1
        lengths.append(length)
    return lengths


def trace_at_rate(
    windows: list[list[int]],
    prompts: list[tuple[int, ...]],
    lengths: list[int],
    arrivals: list[float],
    block: int,
    prompt_order: bool,
) -> list[SimRelQuery]:
    hashes = [block_hashes(list(ids), block) for ids in prompts]
    trace = []
    for index, (window, arrival) in enumerate(zip(windows, arrivals, strict=True)):
        rows = sorted(window, key=lambda beer: prompts[beer]) if prompt_order else window
        requests = [
            SimRequest(f"w{index}#{row}", len(prompts[beer]), hashes[beer], lengths[beer], beer)
            for row, beer in enumerate(rows)
        ]
        trace.append(SimRelQuery(f"w{index}", arrival, MAX_TOKENS, requests))
    return trace


def profile_of(spec: str) -> CostProfile:
    """A profile by name or file, `@N` giving it KV blocks of N tokens."""
    name, _, block = spec.partition("@")
    profile = load_profile(name)
    if not block:
        return profile
    return replace(profile, limits=replace(profile.limits, block_size=int(block)))


def run_seed(job: tuple[str, int, ZipfOptions]) -> list[dict]:
    """Capacity on the trace, then every variant at the load."""
    spec, seed, options = job
    profile = profile_of(spec)
    block = profile.limits.block_size
    prompts = tokenized_beers(read_beers(options.datasets_dir))
    windows = zipf_windows(options, seed, len(prompts))
    lengths = output_lengths(len(prompts), seed)
    gaps = unit_gaps(TraceConfig(num_relqueries=options.relqueries, seed=seed))
    unit_arrivals = list(accumulate(gaps))

    def serve(variant: Variant, rate: float) -> SimRun:
        arrivals = [t / rate for t in unit_arrivals]
        trace = trace_at_rate(windows, prompts, lengths, arrivals, block, variant.prompt_order)
        policy = make_sim_policy(variant.policy, make_cost_model("online", profile))
        return Simulator(profile, policy, variant.sharing).run(trace)

    capacity = options.relqueries / serve(VARIANTS["v1-fcfs"], ALL_AT_ONCE).makespan
    rate = options.load * capacity
    records = []
    for name, variant in VARIANTS.items():
        run = serve(variant, rate)
        totals = [outcome.latency.total for outcome in run.outcomes]
        rows = sum(len(window) for window in windows)
        records.append(
            {
                "profile": spec if "@" in spec else profile_label(spec),
                "block": block,
                "seed": seed,
                "variant": name,
                "capacity": capacity,
                "rate": rate,
                "mean": statistics.fmean(totals),
                "p99": percentile(totals, 0.99),
                "makespan": run.makespan,
                "rows": rows,
                "requests_run": rows - run.requests_followed - run.requests_cached,
                "requests_followed": run.requests_followed,
                "requests_cached": run.requests_cached,
                "prompt_tokens": run.prompt_tokens,
                "prompt_tokens_computed": run.prompt_tokens_computed,
            }
        )
    return records


def run_zipf(options: ZipfOptions, on_done=None) -> list[dict]:
    """Every (profile, seed) job, `workers` at once."""
    for spec in options.profiles:
        profile_of(spec)  # a bad name fails now, not in a worker
    jobs = [(spec, seed, options) for spec in options.profiles for seed in options.seeds]
    return run_pooled(run_seed, jobs, options.workers, on_done)
