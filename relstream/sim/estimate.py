"""What a table would cost before it is sent (`relstream produce --estimate`).

Each row's prompt is rendered as the engine renders it (`model.prepare_row`) and
tokenized as vLLM tokenizes it for the model (SmolLM2's chat template and tokenizer,
`engine.tokenizer`; the simulator's own). Counted: prompt tokens, the share of them in
full KV blocks an earlier row's prompt already filled (what vLLM's prefix cache would
hold were the rows served by one engine with room to keep them), the output budget
(`max_output_tokens` per row: an upper bound), and the rows that could never run
(null or empty input, a template column missing, a prompt over the context).
Tokenized `TOKENIZE_BATCH` rows at a time; memory: one hash per distinct block seen.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relstream.engine.tokenizer import chatml_prompt, encode_batch
from relstream.model import RelQuery, RowRequest, prepare_row
from relstream.sim.kvcache import block_hashes

TOKENIZE_BATCH = 256
EXAMPLES = 3  # rows too long kept by key, to name them


@dataclass
class Estimate:
    """One relQuery's rows, counted before they are sent."""

    rows: int = 0
    runnable: int = 0  # rows that would be asked of the model
    prompt_tokens: int = 0  # of the runnable rows' prompts
    prefix_cached_tokens: int = 0  # of those, in blocks an earlier prompt filled
    output_budget: int = 0  # max_output_tokens per runnable row: at most this many
    too_long: int = 0  # rows whose prompt and output budget exceed the context
    unrunnable: int = 0  # rows refused before the model (null, empty, a missing column)
    too_long_examples: list[tuple[str, int]] = field(default_factory=list)  # key, tokens

    @property
    def prefix_cached_share(self) -> float:
        return self.prefix_cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def estimate(relquery: RelQuery, context_tokens: int, block_size: int = 16) -> Estimate:
    """`relquery`'s rows counted in their order, prompts over `context_tokens` less the
    output budget counted as too long (as the engine refuses them)."""
    found = Estimate(rows=len(relquery.rows))
    seen: set[int] = set()
    most = context_tokens - relquery.max_output_tokens
    batch: list[str] = []
    keys: list[str] = []  # the batch's rows'

    def count(prompts: list[str]) -> None:
        for key, tokens in zip(keys, encode_batch(prompts), strict=True):
            if len(tokens) > most:
                found.too_long += 1
                if len(found.too_long_examples) < EXAMPLES:
                    found.too_long_examples.append((key, len(tokens)))
                continue
            found.runnable += 1
            found.prompt_tokens += len(tokens)
            found.output_budget += relquery.max_output_tokens
            for block in block_hashes(tokens, block_size):
                if block in seen:
                    found.prefix_cached_tokens += block_size
                seen.add(block)

    for index in range(len(relquery.rows)):
        prepared = prepare_row(relquery, index)
        if not isinstance(prepared, RowRequest):
            found.unrunnable += 1
            continue
        batch.append(chatml_prompt(prepared.prompt, relquery.system_prompt))
        keys.append(prepared.row_key)
        if len(batch) == TOKENIZE_BATCH:
            count(batch)
            batch, keys = [], []
    if batch:
        count(batch)
    return found
