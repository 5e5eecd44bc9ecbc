"""Building candidate batches within the engine's limits (shared by every policy)."""

from __future__ import annotations

from collections.abc import Iterable

from relstream.scheduler.view import EngineView, PrefillChunk, SeqInfo


def decode_candidate(view: EngineView) -> tuple[str, ...]:
    """All running requests whose prompt is fully computed (paper: d_cand = Q+)."""
    return tuple(rid for rid, seq in view.tracker.running.items() if seq.prefill_done)


def prefill_candidate(
    view: EngineView,
    candidates: Iterable[SeqInfo],
    token_budget: int | None = None,
    chunk_last: bool = False,
) -> list[PrefillChunk]:
    """Take requests in order while they fit; stop at the first that does not.

    Limits: uncached tokens within `max_num_batched_tokens` (or `token_budget`), the
    running set within `max_num_seqs`, and KV for prompt + output within the free cache.
    Stopping at the first misfit keeps the queue order meaningful (no overtaking). A
    prompt longer than the token budget may still run alone so it cannot block forever.
    With `chunk_last` (chunked prefill) the request that overflows the budget is cut to
    what is left of it instead.
    """
    limits = view.limits
    budget = limits.max_num_batched_tokens if token_budget is None else token_budget
    free_seqs = limits.max_num_seqs - len(view.tracker.running)
    free_kv = view.free_kv_tokens()
    chunks: list[PrefillChunk] = []
    for seq in candidates:
        if len(chunks) >= free_seqs:
            break
        cached = view.cached_prompt_tokens(seq)
        uncached = seq.prompt_tokens - cached
        needed_kv = view.admission_kv_tokens(seq, cached)
        if needed_kv > free_kv:
            break
        if uncached > budget and chunk_last:
            uncached = budget
        elif uncached > budget and chunks:
            break
        chunks.append(PrefillChunk(seq.request_id, uncached))
        budget -= uncached
        free_kv -= needed_kv
        if budget <= 0:
            break
    return chunks
