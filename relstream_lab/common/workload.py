"""The paper's serving trace (§5.1): relQueries of random size over random datasets
and query types, arriving as a Poisson (or bursty gamma) process."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from relstream.connectors.tables import Table, load_csv
from relstream.engine.answers import request_key
from relstream.engine.tokenizer import chatml_prompt, encode_batch
from relstream.model import RelQuery, Template
from relstream.sim.kvcache import block_hashes
from relstream.sim.simulator import SimRelQuery, SimRequest
from relstream_lab.common.templates import (
    BUNDLED_DATASET,
    MAX_TOKENS,
    PAPER_DATASETS,
    QUERY_TYPES,
    DatasetSpec,
)

DEFAULT_DATASETS_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


@dataclass(frozen=True)
class TraceConfig:
    num_relqueries: int = 100
    min_rows: int = 1
    max_rows: int = 100
    arrival: str = "poisson"  # or "gamma"
    burstiness: float = 1.0  # gamma arrivals: coefficient of variation of the gaps
    eos_per_token: float = 0.02  # chance a request ends at each output token
    seed: int = 0
    # (shortest, longest): every relQuery's budget is `longest` and each row's output is
    # drawn uniformly between the two (long answers, e.g. summaries), not by `eos_per_token`
    outputs: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.min_rows <= self.max_rows:
            raise ValueError(f"rows range [{self.min_rows}, {self.max_rows}] is empty")
        if self.arrival not in ("poisson", "gamma"):
            raise ValueError(f"arrival must be 'poisson' or 'gamma', not {self.arrival!r}")
        if not 0.0 <= self.eos_per_token < 1.0:
            raise ValueError("eos_per_token must be in [0, 1)")
        if self.outputs is not None and not 1 <= self.outputs[0] <= self.outputs[1]:
            raise ValueError(f"outputs range {self.outputs} is empty")


@dataclass(frozen=True)
class LoadedDataset:
    spec: DatasetSpec
    table: Table


def load_datasets(datasets_dir: Path | None) -> list[LoadedDataset]:
    """The paper's four tables when `datasets_dir` has them, else the bundled sample."""
    if datasets_dir is not None and all(
        (datasets_dir / spec.filename).exists() for spec in PAPER_DATASETS
    ):
        specs = PAPER_DATASETS
        paths = [datasets_dir / spec.filename for spec in specs]
    else:
        specs = (BUNDLED_DATASET,)
        paths = [Path(BUNDLED_DATASET.filename)]
    loaded = []
    for spec, path in zip(specs, paths, strict=True):
        table = load_csv(path, spec.name)
        for text in spec.templates.values():
            Template(text).check_columns(table.columns)
        loaded.append(LoadedDataset(spec, table))
    return loaded


def unit_gaps(config: TraceConfig) -> list[float]:
    """Inter-arrival gaps for rate 1; dividing by a rate gives that rate's trace, so every
    rate replays the same relQueries in the same order."""
    rng = random.Random(config.seed * 7919 + 1)
    if config.arrival == "poisson":
        return [rng.expovariate(1.0) for _ in range(config.num_relqueries)]
    shape = 1.0 / config.burstiness**2  # gamma with mean 1 and the requested CV
    return [rng.gammavariate(shape, 1.0 / shape) for _ in range(config.num_relqueries)]


@dataclass(frozen=True)
class TraceEntry:
    relquery: RelQuery
    dataset: str
    query_type: str


def generate_relqueries(config: TraceConfig, datasets: Sequence[LoadedDataset]) -> list[TraceEntry]:
    """relQueries with arrival times for rate 1 (rescale with `at_rate`)."""
    rng = random.Random(config.seed)
    entries: list[TraceEntry] = []
    clock = 0.0
    for index, gap in enumerate(unit_gaps(config)):
        clock += gap
        dataset = rng.choice(list(datasets))
        query_type = rng.choice(QUERY_TYPES)
        size = rng.randint(config.min_rows, min(config.max_rows, len(dataset.table.rows)))
        rows = rng.sample(list(dataset.table.rows), size)
        relquery = RelQuery(
            id=f"rq{index:03d}-{dataset.spec.name}-{query_type}",
            template=Template(dataset.spec.templates[query_type]),
            rows=rows,
            max_output_tokens=config.outputs[1] if config.outputs else MAX_TOKENS[query_type],
            arrival_time=clock,
        )
        entries.append(TraceEntry(relquery, dataset.spec.name, query_type))
    return entries


@dataclass
class TokenizedTrace:
    """A trace with token ids resolved once, replayable at any rate."""

    entries: list[TraceEntry]
    token_ids: dict[str, list[list[int]]]
    output_lengths: dict[str, list[int]]
    answer_keys: dict[str, list[int | None]]  # each row's `answer_key`

    def at_rate(self, rate: float, block_size: int) -> list[SimRelQuery]:
        """The trace as the simulator serves it, arrivals scaled to `rate` relQueries a
        second. Each request carries the engine's answer key, which only a simulator told
        to share work reads."""
        out = []
        for entry in self.entries:
            relquery = entry.relquery
            requests = [
                SimRequest(
                    f"{relquery.id}#{row}",
                    len(ids),
                    block_hashes(ids, block_size),
                    self.output_lengths[relquery.id][row],
                    self.answer_keys[relquery.id][row],
                )
                for row, ids in enumerate(self.token_ids[relquery.id])
            ]
            out.append(
                SimRelQuery(
                    relquery.id,
                    relquery.arrival_time / rate,
                    relquery.max_output_tokens,
                    requests,
                    {"dataset": entry.dataset, "query_type": entry.query_type},
                )
            )
        return out


def answer_key(relquery: RelQuery, token_ids: Sequence[int]) -> int | None:
    """The engine's key of a row's request (`engine.answers.request_key`: prompt tokens,
    sampling, output constraint, token limit) as the simulator's integer: rows the engine
    answers once get one key."""
    key = request_key(relquery, list(token_ids), model="")
    return None if key is None else int.from_bytes(key.digest[:8], "big")


def tokenize_trace(
    entries: list[TraceEntry],
    config: TraceConfig,
    output_tokens: Mapping[str, Sequence[int]] | None = None,
) -> TokenizedTrace:
    """Render every row through the chat template and tokenize it. Each request ends
    where a real run's row ended when `output_tokens` (relQuery id -> tokens per row) is
    given (replay), else where a geometric draw puts its end-of-sequence; never past max
    tokens."""
    rng = random.Random(config.seed + 104729)
    token_ids: dict[str, list[list[int]]] = {}
    lengths: dict[str, list[int]] = {}
    keys: dict[str, list[int | None]] = {}
    for entry in entries:
        relquery = entry.relquery
        requests, failures = relquery.instantiate()
        if failures:
            raise ValueError(f"{relquery.id}: {failures[0].reason}")
        prompts = [chatml_prompt(r.prompt, relquery.system_prompt) for r in requests]
        token_ids[relquery.id] = encode_batch(prompts)
        keys[relquery.id] = [answer_key(relquery, ids) for ids in token_ids[relquery.id]]
        sampled = [_sample_output_length(rng, relquery.max_output_tokens, config) for _ in requests]
        if output_tokens is not None:
            real = output_tokens[relquery.id]
            sampled = [min(max(real[r.row_index], 1), relquery.max_output_tokens) for r in requests]
        lengths[relquery.id] = sampled
    return TokenizedTrace(entries, token_ids, lengths, keys)


def _sample_output_length(rng: random.Random, max_tokens: int, config: TraceConfig) -> int:
    if config.outputs is not None:
        return rng.randint(*config.outputs)
    length = 1
    while length < max_tokens and rng.random() >= config.eos_per_token:
        length += 1
    return length
