"""`relstream-lab bench prefix --backend vllm`: the prompt tokens the real engine computes for
one window per table and query type, the templates as written against free field order.

One engine, vLLM's prefix cache emptied before each relQuery, so each window starts
cold as in `relstream_lab.prefix.sim` (where earlier windows may help); the tokens
computed are read from the plug-in's step log (`uncached_tokens` of every step), the
prompt tokens from the same tokenization the simulated count uses. Outputs are one token:
only prompts are measured.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from relstream.backend import run
from relstream.engine.runtime import EngineSettings, VllmRuntime
from relstream.model import RelQuery, Template
from relstream_lab.campaign.checkpoint import read_step_log
from relstream_lab.common.report import machine_description, write_readme
from relstream_lab.common.workload import LoadedDataset
from relstream_lab.prefix.sim import prompt_token_ids, row_prompts

VARIANTS = ("template", "free fields")


def window_relqueries(dataset: LoadedDataset, query_type: str, rows: int) -> dict[str, RelQuery]:
    text = dataset.spec.templates[query_type]
    chunk = list(dataset.table.rows[:rows])
    name = f"{dataset.spec.name}-{query_type}"
    instruction = Template(text.split("\n", 1)[0])
    columns = Template(text).columns
    return {
        VARIANTS[0]: RelQuery(f"{name}-template", Template(text), chunk, 1),
        VARIANTS[1]: RelQuery(f"{name}-free", instruction, chunk, 1, fields=columns),
    }


async def measure(datasets: list[LoadedDataset], rows: int, log: Path, say=print) -> list[dict]:
    engine = await VllmRuntime.start(EngineSettings(step_log=log))
    records = []
    logged = 0  # steps in the log before the relQuery being measured
    try:
        for dataset in datasets:
            for query_type in dataset.spec.templates:
                record = {"table": dataset.spec.name, "query_type": query_type, "rows": rows}
                for variant, relquery in window_relqueries(dataset, query_type, rows).items():
                    await engine.reset_prefix_cache()
                    await run(engine, relquery)
                    steps = read_step_log(log)[1]
                    steps, logged = steps[logged:], len(steps)
                    prompts = prompt_token_ids(row_prompts(relquery))
                    record[variant] = {
                        "prompt_tokens": sum(len(ids) for ids in prompts),
                        "computed": sum(step.uncached_tokens for step in steps),
                    }
                records.append(record)
                say(f"{dataset.spec.name} {query_type}: measured")
    finally:
        engine.shutdown()
    return records


def write_real_report(records: list[dict], out: Path, command: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = [
        "# Prompt tokens the real engine computes (vLLM CPU build, blocks of 128)",
        "",
        f"Command: `{command}`",
        "",
        f"Machine: {machine_description()}. One window of {records[0]['rows']} rows per "
        "table and query type, each relQuery on an emptied prefix cache.",
        "",
        "| table | prompt tokens: template | computed: template | computed: free fields "
        "| free fields / template |",
        "|---|---|---|---|---|",
    ]
    for table in dict.fromkeys(r["table"] for r in records):
        mine = [r for r in records if r["table"] == table]
        total = sum(r[VARIANTS[0]]["prompt_tokens"] for r in mine)
        computed = {v: sum(r[v]["computed"] for r in mine) for v in VARIANTS}
        ratio = computed[VARIANTS[1]] / computed[VARIANTS[0]]
        lines.append(
            f"| {table} | {total} | {computed[VARIANTS[0]]} | {computed[VARIANTS[1]]} "
            f"| {ratio:.2f}x |"
        )
    write_readme(out, [*lines, ""])


def run_real(datasets: list[LoadedDataset], rows: int, out: Path, command: str, say) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = out / "steps.jsonl"
    log.unlink(missing_ok=True)
    records = asyncio.run(measure(datasets, rows, log, say))
    log.unlink()
    write_real_report(records, out, command)
