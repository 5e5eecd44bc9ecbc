from __future__ import annotations

from relstream.scheduler import EngineLimits, EngineView, RequestTracker, SeqInfo


class ScriptedView(EngineView):
    """An EngineView whose prefix cache and clock the test sets by hand."""

    def __init__(self, limits: EngineLimits, now: float = 0.0) -> None:
        self.tracker = RequestTracker()
        self.limits = limits
        self.clock = now
        self.cached: dict[str, int] = {}
        self.free_tokens = 10**9

    def now(self) -> float:
        return self.clock

    def cached_prompt_tokens(self, seq: SeqInfo) -> int:
        return self.cached.get(seq.request_id, 0)

    def free_kv_tokens(self) -> int:
        return self.free_tokens

    def add_relquery(
        self,
        relquery_id: str,
        prompts: list[int],
        max_tokens: int,
        arrival: float = 0.0,
        deadline: float | None = None,
    ) -> list[str]:
        ids = []
        for row, prompt in enumerate(prompts):
            seq = SeqInfo(
                f"{relquery_id}#{row}", relquery_id, prompt, max_tokens, arrival, deadline=deadline
            )
            self.tracker.add_request(seq, len(prompts))
            ids.append(seq.request_id)
        return ids

    def start(self, request_id: str) -> None:
        """Mark a request prefilled, as an engine would after its prefill step."""
        seq = self.tracker.start(request_id)
        self.tracker.record_progress(seq, computed=seq.prompt_tokens, generated=1)
