"""The engine's request state as a policy reads it: waiting, running and held requests
grouped by relQuery, updated incrementally by the engine (arrival, step, finish), and the
per-request cap on a step's prompt tokens that follows from it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

from relstream.scheduler.data import EngineLimits, RelQueryInfo, SeqInfo, StepPlan
from relstream.scheduler.lengths import OutputLengths


def prefill_cap(limits: EngineLimits, tracker: RequestTracker) -> int | None:
    """The most tokens one request may compute in a step (None: no cap), as vLLM V1
    applies `long_prefill_token_threshold` so that one long prompt does not starve the
    others of the token budget: off while a single request is running or waiting, and,
    adaptive, never below the budget's fair share among them."""
    threshold = limits.long_prefill_token_threshold
    eligible = len(tracker.running) + len(tracker.waiting) + len(tracker.held)
    if threshold <= 0 or eligible <= 1:
        return None
    if limits.long_prefill_adaptive:
        return max(threshold, limits.max_num_batched_tokens // eligible)
    return threshold


class RequestTracker:
    """Waiting/running requests grouped by relQuery, updated by the engine.

    Identical requests (equal `SeqInfo.share`) are all tracked, each in its own relQuery,
    so each relQuery is ranked as itself: the first to start runs for all, and its twins
    are held (`held`, out of `waiting`) until it finishes. A twin that ends without an
    answer (aborted, its relQuery cancelled) or is preempted hands over: the held ones
    wait again, and the next to start runs for the rest."""

    def __init__(self) -> None:
        self.waiting: OrderedDict[str, SeqInfo] = OrderedDict()  # global arrival order
        self.running: dict[str, SeqInfo] = {}  # admission order
        self.held: dict[str, SeqInfo] = {}  # waiting on a running twin
        self.relqueries: dict[str, RelQueryInfo] = {}
        self.active_relqueries: dict[str, RelQueryInfo] = {}  # those with running requests
        self.prompting: dict[str, SeqInfo] = {}  # running, prompt not all computed
        self._changed: set[str] = set()
        self.outputs = OutputLengths()  # how long finished rows' outputs were
        self._twins: dict[str, dict[str, SeqInfo]] = {}  # share -> its unanswered requests
        self._runs: dict[str, str] = {}  # share -> the request running for its twins

    def __contains__(self, request_id: object) -> bool:
        """The request is tracked: waiting, running or held."""
        return request_id in self.waiting or request_id in self.running or request_id in self.held

    def add_request(self, seq: SeqInfo, relquery_size: int) -> RelQueryInfo:
        info = self.relqueries.get(seq.relquery_id)
        if info is None:
            info = RelQueryInfo(
                seq.relquery_id,
                seq.arrival_time,
                relquery_size,
                seq.max_tokens,
                deadline=seq.deadline,
                priority=seq.priority,
                query=seq.query,
            )
            self.relqueries[seq.relquery_id] = info
        info.prompt_tokens_seen += seq.prompt_tokens
        self._changed.add(seq.relquery_id)
        if seq.share is not None:
            self._twins.setdefault(seq.share, {})[seq.request_id] = seq
            if seq.share in self._runs:
                self._hold(seq)
                return info
        self._enqueue(seq)
        return info

    def start(self, request_id: str) -> SeqInfo:
        """Move a request from waiting to running (its first prefill was scheduled)."""
        seq = self.waiting.pop(request_id)
        info = self.relqueries[seq.relquery_id]
        del info.waiting[request_id]
        info.unwait(seq)
        info.running[request_id] = seq
        self.running[request_id] = seq
        if not seq.prefill_done:  # it computes its prompt first (its output too, if resumed)
            info.prompting[request_id] = self.prompting[request_id] = seq
        self.active_relqueries[seq.relquery_id] = info
        self._changed.add(seq.relquery_id)
        if seq.share is not None:  # it runs for its twins: they wait on it
            self._runs[seq.share] = request_id
            for twin in list(self._twins[seq.share].values()):
                if twin.request_id in self.waiting:
                    self._dequeue(twin)
                    self._hold(twin)
        return seq

    def requeue(self, request_id: str) -> SeqInfo:
        """A running request was preempted by recompute: its KV is gone, it waits again at
        the front and will prefill its prompt and output so far."""
        seq = self.running.pop(request_id)
        seq.computed_tokens = 0
        info = self.relqueries[seq.relquery_id]
        del info.running[request_id]
        self._unprompt(info, request_id)
        info.waiting[request_id] = seq
        info.wait(seq)
        info.waiting.move_to_end(request_id, last=False)
        self.waiting[request_id] = seq
        self.waiting.move_to_end(request_id, last=False)
        self._deactivate_if_idle(info)
        self._changed.add(seq.relquery_id)
        if seq.share is not None and self._runs.get(seq.share) == request_id:
            self._hand_over(seq.share)
        return seq

    def record_progress(self, seq: SeqInfo, computed: int = 0, generated: int = 0) -> None:
        seq.computed_tokens += computed
        seq.output_tokens += generated
        self._changed.add(seq.relquery_id)
        # A decode (one token computed, one generated) leaves `prefill_done` as it was;
        # equal steps back (rejected speculative tokens) are looked at.
        if computed != generated or generated < 0 or seq.request_id in self.prompting:
            self._track_prompt(seq)

    def finish(self, request_id: str, answered: bool = True) -> RelQueryInfo | None:
        """Drop a finished request; returns its relQuery when that was its last one.
        `answered`: it ended with the answer its twins share (by stop or length); else
        (aborted, failed) its held twins wait again."""
        seq = (
            self.running.pop(request_id, None)
            or self.held.pop(request_id, None)
            or self.waiting.pop(request_id)
        )
        info = self.relqueries[seq.relquery_id]
        info.running.pop(request_id, None)
        self._unprompt(info, request_id)
        if info.waiting.pop(request_id, None) is not None:
            info.unwait(seq)
        info.finished += 1
        if info.held.pop(request_id, None) is not None:
            info.twin_answered += 1
        else:
            info.finished_output_tokens += seq.output_tokens
            self.outputs.add(seq.max_tokens, seq.output_tokens)
        self._deactivate_if_idle(info)
        self._changed.add(seq.relquery_id)
        if seq.share is not None:
            self._finish_twin(seq, answered)
        if info.waiting or info.running or info.held:
            return None
        del self.relqueries[seq.relquery_id]
        return info

    def unshared(self, plan: StepPlan) -> StepPlan:
        """`plan` admitting at most one of each set of waiting twins: the first to start
        runs for the others (the mechanisms apply it to every plan)."""
        seen: set[str] = set()
        kept = []
        for chunk in plan.prefill:
            seq = self.waiting.get(chunk.request_id)
            if seq is not None and seq.share is not None:
                if seq.share in seen:
                    continue
                seen.add(seq.share)
            kept.append(chunk)
        if len(kept) == len(plan.prefill):
            return plan
        return replace(plan, prefill=tuple(kept))  # its cut budget kept (`classes`)

    def drain_changed(self) -> set[str]:
        return self.drain_changes()[0]

    def drain_changes(self) -> tuple[set[str], set[str]]:
        """RelQueries changed since the last drain: those still tracked, and those gone
        (their last request finished). A relQuery leaves the tracker only by a change, so
        a policy learns of every finish here, without comparing all it holds."""
        changed, self._changed = self._changed, set()
        live = {rq for rq in changed if rq in self.relqueries}
        return live, changed - live

    def _track_prompt(self, seq: SeqInfo) -> None:
        """Keep `prompting` true of a running row whose progress changed."""
        request_id = seq.request_id
        if request_id not in self.running:
            return
        info = self.relqueries[seq.relquery_id]
        if seq.prefill_done:
            self._unprompt(info, request_id)
        elif request_id not in self.prompting:  # back to prompting: kept in running order
            self.prompting[request_id] = seq
            prompting = self.prompting
            self.prompting = {rid: row for rid, row in self.running.items() if rid in prompting}
            info.prompting = {rid: row for rid, row in info.running.items() if rid in prompting}

    def _unprompt(self, info: RelQueryInfo, request_id: str) -> None:
        if self.prompting.pop(request_id, None) is not None:
            del info.prompting[request_id]

    def _deactivate_if_idle(self, info: RelQueryInfo) -> None:
        if not info.running:
            self.active_relqueries.pop(info.relquery_id, None)

    def _enqueue(self, seq: SeqInfo) -> None:
        self.relqueries[seq.relquery_id].waiting[seq.request_id] = seq
        self.relqueries[seq.relquery_id].wait(seq)
        self.waiting[seq.request_id] = seq

    def _dequeue(self, seq: SeqInfo) -> None:
        del self.waiting[seq.request_id]
        info = self.relqueries[seq.relquery_id]
        del info.waiting[seq.request_id]
        info.unwait(seq)

    def _hold(self, seq: SeqInfo) -> None:
        self.held[seq.request_id] = seq
        self.relqueries[seq.relquery_id].held[seq.request_id] = seq
        self._changed.add(seq.relquery_id)

    def _hand_over(self, share: str) -> None:
        """The twin running for `share` stopped without its answer: the held ones wait
        again, in arrival order, and the next to start runs for the rest."""
        del self._runs[share]
        for twin in self._twins.get(share, {}).values():
            if self.held.pop(twin.request_id, None) is not None:
                del self.relqueries[twin.relquery_id].held[twin.request_id]
                self._enqueue(twin)
                self._changed.add(twin.relquery_id)

    def _finish_twin(self, seq: SeqInfo, answered: bool) -> None:
        twins = self._twins.get(seq.share) or {}
        twins.pop(seq.request_id, None)
        if self._runs.get(seq.share) == seq.request_id:
            if answered:  # the held twins have their answer: they only wait to finish
                del self._runs[seq.share]
                twins.clear()
            else:
                self._hand_over(seq.share)
        if not twins:
            self._twins.pop(seq.share, None)
