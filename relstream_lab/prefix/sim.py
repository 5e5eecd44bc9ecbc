"""`relstream-lab bench prefix`: the prompt tokens a prefix cache leaves to compute, per table
and query type of the paper's trace, for three ways of sending the same rows:

- `template, arrival order`: the templates as written, rows in table order (what stock
  vLLM V1 is sent);
- `template, prompt order`: the same prompts, each window's rows in prompt order (what
  relstream's engine hands vLLM);
- `free fields, prompt order`: the template's first line as the instruction and its
  columns as free fields (`RelQuery.fields`), laid out shared first, in prompt order.

Rows are cut into windows (one relQuery each); every earlier row's full blocks stay
cached (an unbounded cache: the best case for every variant), and a request computes its
tokens after its longest cached prefix of full blocks, at least one (vLLM recomputes the
last). Prompts are tokenized as the engine sends them (SmolLM2's chat template).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from relstream.engine.tokenizer import chatml_prompt, encode_batch
from relstream.model import RelQuery, RowRequest, Template, prepare_row
from relstream.sim.kvcache import block_hashes
from relstream_lab.common.report import machine_description
from relstream_lab.common.workload import LoadedDataset

VARIANTS = ("template, arrival order", "template, prompt order", "free fields, prompt order")
# LLM-SQL (Liu et al., MLSys 2025), vLLM prefix hit rates: rows and fields as given, then
# reordered by GGR. Their setup differs (their own queries, whole tables at once).
LLM_SQL_HIT_RATES = {
    "products": (0.267, 0.833),
    "movies": (0.346, 0.857),
    "pdmx": (0.118, 0.566),
    "beer": (0.499, 0.801),
}


@dataclass(frozen=True)
class PrefixCell:
    table: str
    query_type: str
    block: int
    prompt_tokens: dict[str, int]  # variant -> its rows' prompts, in full
    computed: dict[str, int]  # variant -> tokens the cache left to compute


def computed_tokens(prompts: list[list[int]], block: int, cached: set[int]) -> int:
    """Tokens computed for `prompts` in order, each one's full blocks then cached."""
    computed = 0
    for ids in prompts:
        hashes = block_hashes(ids, block)
        hit = next((i for i, h in enumerate(hashes) if h not in cached), len(hashes))
        computed += max(len(ids) - hit * block, 1)
        cached.update(hashes)
    return computed


def _windows(dataset: LoadedDataset, rows: int, window: int) -> list[list]:
    table_rows = list(dataset.table.rows[:rows])
    return [table_rows[i : i + window] for i in range(0, len(table_rows), window)]


def prompt_token_ids(requests: list[RowRequest]) -> list[list[int]]:
    return encode_batch([chatml_prompt(request.prompt) for request in requests])


def row_prompts(relquery: RelQuery) -> list[RowRequest]:
    prepared = (prepare_row(relquery, i) for i in range(len(relquery.rows)))
    return [request for request in prepared if isinstance(request, RowRequest)]


def measure_cell(
    dataset: LoadedDataset, query_type: str, rows: int, window: int, blocks: tuple[int, ...]
) -> list[PrefixCell]:
    text = dataset.spec.templates[query_type]
    template = Template(text)
    instruction = Template(text.split("\n", 1)[0])
    plain, free = [], []
    for number, chunk in enumerate(_windows(dataset, rows, window)):
        name = f"{query_type}-{number}"
        plain.append(prompt_token_ids(row_prompts(RelQuery(name, template, chunk, 8))))
        free_query = RelQuery(name, instruction, chunk, 8, fields=template.columns)
        free.append(prompt_token_ids(row_prompts(free_query)))
    orders = {
        VARIANTS[0]: plain,
        VARIANTS[1]: [sorted(w) for w in plain],
        VARIANTS[2]: [sorted(w) for w in free],
    }
    totals = {variant: sum(len(ids) for w in o for ids in w) for variant, o in orders.items()}
    cells = []
    for block in blocks:
        computed = {}
        for variant, windows in orders.items():
            cached: set[int] = set()
            computed[variant] = sum(computed_tokens(w, block, cached) for w in windows)
        cells.append(PrefixCell(dataset.spec.name, query_type, block, totals, computed))
    return cells


def write_report(cells: list[PrefixCell], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps([asdict(c) for c in cells], indent=1) + "\n")
    lines = [
        "# Prompt tokens the prefix cache leaves to compute",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_description()} (a count, not a timing: any machine gives it).",
        "",
        "Per table, summed over its five query types: the share of each variant's prompt",
        "tokens the cache served (hit rate), and the tokens the free-field variant computes",
        "against the templates in arrival order (what stock V1 computes). Free fields write",
        "`name: value` lines with the column names, so their prompts are a little longer.",
    ]
    for block in sorted({c.block for c in cells}):
        lines += ["", f"## Blocks of {block} tokens", ""]
        header = " | ".join(f"hit rate: {v}" for v in VARIANTS)
        lines.append(f"| table | {header} | free fields / V1 | LLM-SQL (given → GGR) |")
        lines.append("|---" * (len(VARIANTS) + 3) + "|")
        for table in dict.fromkeys(c.table for c in cells):
            mine = [c for c in cells if c.table == table and c.block == block]
            total = {v: sum(c.prompt_tokens[v] for c in mine) for v in VARIANTS}
            computed = {v: sum(c.computed[v] for c in mine) for v in VARIANTS}
            rates = " | ".join(f"{1 - computed[v] / total[v]:.1%}" for v in VARIANTS)
            given, ggr = LLM_SQL_HIT_RATES.get(table, (float("nan"), float("nan")))
            ratio = computed[VARIANTS[2]] / computed[VARIANTS[0]]
            lines.append(f"| {table} | {rates} | {ratio:.2f}x | {given:.1%} → {ggr:.1%} |")
    (out / "README.md").write_text("\n".join(lines) + "\n")
