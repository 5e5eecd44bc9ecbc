"""Building candidate batches within the engine's limits (the paper's V0-style policies)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from relstream.scheduler.admission import Chunking, StepAdmission
from relstream.scheduler.data import PrefillChunk, SeqInfo
from relstream.scheduler.view import EngineView

# vLLM keeps 1% of the KV blocks free when admitting, so decodes can grow a little
# before anything has to be preempted.
KV_WATERMARK = 0.01


@dataclass
class Room:
    """Capacity a prefill batch may use: KV tokens and running-set slots."""

    kv_tokens: int
    seqs: int

    @classmethod
    def free_in(cls, view: EngineView) -> Room:
        watermark = int(view.limits.kv_capacity_tokens * KV_WATERMARK)
        return cls(
            view.free_kv_tokens() - watermark,
            view.limits.max_num_seqs - len(view.tracker.running),
        )


def decode_candidate(view: EngineView) -> tuple[str, ...]:
    """All running requests whose prompt is fully computed (paper: d_cand = Q+)."""
    return tuple(rid for rid, seq in view.tracker.running.items() if seq.prefill_done)


def prefill_candidate(
    view: EngineView,
    candidates: Iterable[SeqInfo],
    token_budget: int | None = None,
    chunk_last: bool = False,
    room: Room | None = None,
) -> list[PrefillChunk]:
    """vLLM V0's prefill batch: requests in order while they fit (`StepAdmission`), whole
    prompts only (one longer than the budget may run alone, so it cannot block forever)
    unless `chunk_last` cuts the one that overflows the budget, within `room` (the free
    KV less vLLM's watermark, and the free seats)."""
    room = room or Room.free_in(view)
    chunking = Chunking.CUT if chunk_last else Chunking.WHOLE
    step = StepAdmission.for_step(view, chunking, token_budget, room.kv_tokens, room.seqs)
    step.admit(candidates)
    return step.admitted


def preemption_victims(
    view: EngineView, head: SeqInfo, rank: Callable[[SeqInfo], tuple]
) -> tuple[list[str], Room]:
    """vLLM's priority policy (V0 `_schedule_priority_preemption`): while the best waiting
    request cannot be admitted, evict running requests ranked below it by recompute,
    worst first and, among equals, the latest admitted first.

    Returns the victims and the room the prefill batch will have once they are gone.
    """
    room = Room.free_in(view)
    needed = view.admission_kv_tokens(head, view.cached_prompt_tokens(head))
    head_rank = rank(head)
    victims: list[str] = []
    newest_first = reversed(list(view.tracker.running.values()))
    for seq in sorted(newest_first, key=rank, reverse=True):
        if needed <= room.kv_tokens and room.seqs >= 1:
            break
        if rank(seq) <= head_rank:
            break
        victims.append(seq.request_id)
        room.kv_tokens += view.releasable_kv_tokens(seq)
        room.seqs += 1
    return victims, room
