"""The simulator: executes a policy's StepPlans on a virtual clock, step by step.

It is an EngineView like the vLLM adapter, so every policy decision it runs is the
production code path; only execution is modelled: step durations come from a named
CostProfile, memory from a block-level prefix cache on the requests' real token ids.

Requests end at their sampled output length (drawn by the workload, never more than
max tokens); the scheduler only ever knows max tokens, as in a real engine. KV is taken
as vLLM takes it: prompt blocks at admission, one more block whenever a decode crosses a
block boundary; when none is free, the most recently admitted running request is
preempted by recompute (vLLM's default), and the policy sees it waiting again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from relstream.model import LatencyBreakdown
from relstream.scheduler.data import SeqInfo, StepFeedback, StepKind, StepPlan
from relstream.scheduler.policies import Policy
from relstream.scheduler.registry import holds_twins
from relstream.scheduler.tracker import RequestTracker
from relstream.scheduler.view import EngineView
from relstream.sim.kvcache import PrefixCachedKV
from relstream.sim.profiles import CostProfile
from relstream.sim.sharing import CACHED, Follow, SharedWork, Sharing


@dataclass
class SimRequest:
    request_id: str
    prompt_tokens: int
    block_hashes: tuple[int, ...]
    output_length: int  # where this request's end-of-sequence falls
    answer_key: int | None = None  # equal keys, equal answers (greedy); None: never shared


@dataclass
class SimRelQuery:
    relquery_id: str
    arrival_time: float
    max_tokens: int
    requests: list[SimRequest]
    labels: dict[str, str] = field(default_factory=dict)
    deadline: float | None = None  # when its user wants it answered, on the sim clock
    priority: int = 0  # its class: higher goes first (`scheduler.classes`)
    query: str = ""  # the registered query it is a window of (`scheduler.fairshare`)


@dataclass
class _Timeline:
    arrival: float
    first_prefill_start: float | None = None
    last_prefill_end: float | None = None
    finish: float | None = None


@dataclass
class RelQueryOutcome:
    relquery_id: str
    requests: int
    labels: dict[str, str]
    latency: LatencyBreakdown
    deadline_met: bool | None = None  # None: it had no deadline


@dataclass
class SimRun:
    outcomes: list[RelQueryOutcome]
    decision_seconds: list[float]
    step_counts: dict[str, int]
    preemptions: int
    makespan: float
    cost_coefficients: dict[str, float]
    prompt_tokens: int = 0  # prompt tokens of the requests that ran (none shared)
    prompt_tokens_computed: int = 0  # of those, not found in the prefix cache
    requests_followed: int = 0  # requests answered by an identical one's run
    requests_cached: int = 0  # requests answered from the answer cache


class SimulationStalled(RuntimeError):
    pass


class Simulator(EngineView):
    def __init__(
        self, profile: CostProfile, policy: Policy, sharing: Sharing | None = None
    ) -> None:
        self.profile = profile
        self.policy = policy
        self.shared = SharedWork(sharing or Sharing(), holds_twins(policy.name))
        self.limits = profile.limits
        self.tracker = RequestTracker()
        self.kv = PrefixCachedKV(
            profile.limits.kv_capacity_tokens // profile.limits.block_size,
            profile.limits.block_size,
        )
        self.clock = 0.0
        self._requests: dict[str, SimRequest] = {}
        self._timelines: dict[str, _Timeline] = {}
        self._unfinished: dict[str, int] = {}  # relQuery -> its requests not yet answered
        self._arrived: dict[str, SimRelQuery] = {}  # unanswered relQueries
        self.prompt_tokens = self.prompt_tokens_computed = 0
        self._steps = {kind.value: 0 for kind in StepKind}
        self.preemptions = 0

    # EngineView
    def now(self) -> float:
        return self.clock

    def cached_prompt_tokens(self, seq: SeqInfo) -> int:
        request = self._requests[seq.request_id]
        return self.kv.hit_blocks(request.block_hashes, seq.prompt_tokens) * self.limits.block_size

    def free_kv_tokens(self) -> int:
        return self.kv.free_blocks() * self.limits.block_size

    def admission_kv_tokens(self, seq: SeqInfo, cached_tokens: int) -> int:
        request = self._requests[seq.request_id]
        blocks = self.kv.blocks_needed(
            request.block_hashes, seq.prompt_tokens, seq.uncomputed_tokens
        )
        return blocks * self.limits.block_size

    def true_remaining_output(self, seq: SeqInfo) -> int:
        """Tokens `seq` will still generate: known to the simulator alone, for the
        clairvoyant reference."""
        return max(self._requests[seq.request_id].output_length - seq.output_tokens, 1)

    def growth_kv_tokens(self, seq: SeqInfo, new_tokens: int) -> int:
        missing = self.kv.missing_blocks(seq.request_id, seq.computed_tokens + new_tokens)
        return missing * self.limits.block_size

    def releasable_kv_tokens(self, seq: SeqInfo) -> int:
        return self.kv.releasable_blocks(seq.request_id) * self.limits.block_size

    # execution
    def run(
        self,
        relqueries: Sequence[SimRelQuery],
        on_step: Callable[[int, int], None] | None = None,
    ) -> SimRun:
        """Serve `relqueries`; `on_step(finished, total)` reports progress."""
        pending = sorted(relqueries, key=lambda rq: rq.arrival_time)
        outcomes: list[RelQueryOutcome] = []
        decisions: list[float] = []
        next_arrival = 0
        done: list[str] = []

        def record(finished_ids: list[str]) -> None:
            for outcome in self.answered(finished_ids):
                outcomes.append(outcome)
                if on_step:
                    on_step(len(outcomes), len(pending))

        while next_arrival < len(pending) or self._unfinished:
            while next_arrival < len(pending) and pending[next_arrival].arrival_time <= self.clock:
                self.admit(pending[next_arrival], done)
                next_arrival += 1
            record(done)
            done.clear()
            started = time.perf_counter()
            plan = self.policy.plan(self)
            decisions.append(time.perf_counter() - started)
            if plan.kind is StepKind.IDLE and not plan.preempt:  # evictions alone are a step
                if next_arrival == len(pending) and not self._unfinished:
                    break  # the last arrivals were answered without a step
                if next_arrival == len(pending):
                    raise SimulationStalled(
                        f"policy {self.policy.name} idles with "
                        f"{len(self.tracker.waiting)} requests waiting"
                    )
                self.clock = max(self.clock, pending[next_arrival].arrival_time)
                continue
            record(self.execute(plan))
        return SimRun(
            outcomes=outcomes,
            decision_seconds=decisions,
            step_counts=dict(self._steps),
            preemptions=self.preemptions,
            makespan=self.clock,
            cost_coefficients=self.policy.cost_coefficients(),
            prompt_tokens=self.prompt_tokens,
            prompt_tokens_computed=self.prompt_tokens_computed,
            requests_followed=self.shared.followed,
            requests_cached=self.shared.cached,
        )

    @property
    def busy(self) -> bool:
        """Some relQuery it took is not answered yet."""
        return bool(self._unfinished)

    def answered(self, finished_ids: list[str]) -> list[RelQueryOutcome]:
        """The outcomes of relQueries `execute` or `admit` reported done."""
        return [
            self._outcome(self._arrived.pop(rid), self._timelines.pop(rid)) for rid in finished_ids
        ]

    def admit(self, relquery: SimRelQuery, done: list[str] | None = None) -> None:
        """Take `relquery`'s requests: those that run go to the policy; the others follow
        a leader or are answered at once (`done` gets the relQuery if nothing is left)."""
        done = [] if done is None else done
        self._arrived[relquery.relquery_id] = relquery
        self._timelines[relquery.relquery_id] = _Timeline(relquery.arrival_time)
        running, following = [], 0
        for request in relquery.requests:
            role = self.shared.role(request.request_id, relquery.relquery_id, request.answer_key)
            if isinstance(role, Follow):
                following += 1
            elif role is not CACHED:
                running.append(request)
        self._unfinished[relquery.relquery_id] = len(running) + following
        if not running and not following:
            self._finish(relquery.relquery_id, done, answered=0)
        for request in running:
            needed = -(-(request.prompt_tokens + relquery.max_tokens) // self.limits.block_size)
            if needed > self.kv.capacity_blocks:
                raise ValueError(
                    f"request {request.request_id} needs {needed} KV blocks; the "
                    f"{self.profile.name} cache holds {self.kv.capacity_blocks}"
                )
            self._requests[request.request_id] = request
            seq = SeqInfo(
                request.request_id,
                relquery.relquery_id,
                request.prompt_tokens,
                relquery.max_tokens,
                relquery.arrival_time,
                deadline=relquery.deadline,
                share=self.shared.share(request.answer_key),
                priority=relquery.priority,
                query=relquery.query,
            )
            self.prompt_tokens += request.prompt_tokens
            self.tracker.add_request(seq, len(running))

    def execute(self, plan: StepPlan) -> list[str]:
        """Run one step; returns the relQueries it completed."""
        start = self.clock
        plan = self.tracker.unshared(plan)
        for request_id in plan.preempt:
            self._preempt(request_id)
        prefills = self._begin_prefills(plan, start)
        decodes = self._grow_for_decode(plan, {seq.request_id for seq, _ in prefills})
        if not prefills and not decodes:
            if plan.preempt:
                return []  # evictions alone take no model time: the clock stays
            raise SimulationStalled(f"policy {self.policy.name} planned a step that cannot run")
        uncached = sum(compute for _, compute in prefills)
        self.prompt_tokens_computed += uncached
        context = sum(seq.computed_tokens for seq in decodes)
        duration = self.profile.step_time(uncached, len(decodes), context)
        self.clock = start + duration
        kind = StepKind.of(bool(prefills), bool(decodes))
        self._steps[kind.value] += 1
        self.policy.observe(StepFeedback(kind, uncached, len(decodes), duration, context))
        done: list[str] = []
        for seq, compute in prefills:
            self.tracker.record_progress(seq, computed=compute)
            if seq.uncomputed_tokens == 0:
                self._complete_prefill(seq, done)
        for seq in decodes:
            self.tracker.record_progress(seq, computed=1, generated=1)
            self._maybe_finish(seq, done)
        return done

    def _preempt(self, request_id: str) -> None:
        self.kv.release(request_id)
        self.tracker.requeue(request_id)
        self.preemptions += 1

    def _grow_for_decode(self, plan: StepPlan, prefilling: set[str]) -> list[SeqInfo]:
        """Give every planned decode a slot for its next token, preempting the newest
        running requests (possibly the decode itself) when the cache is full."""
        running = self.tracker.running
        ready: list[SeqInfo] = []
        for request_id in plan.decode:
            seq = running.get(request_id)
            while seq is not None and not self.kv.ensure_capacity(
                request_id, seq.computed_tokens + 1
            ):
                protected = prefilling | {s.request_id for s in ready}
                victim = next(rid for rid in reversed(running) if rid not in protected)
                self._preempt(victim)
                if victim == request_id:
                    seq = None
            if seq is not None:
                ready.append(seq)
        return ready

    def _begin_prefills(self, plan: StepPlan, start: float) -> list[tuple[SeqInfo, int]]:
        """Admit the plan's new requests into the KV cache; returns (request, tokens to
        compute) for every prefill chunk that can run."""
        waiting = self.tracker.waiting
        fresh = [
            (
                rid,
                self._requests[rid].block_hashes,
                seq.prompt_tokens,
                seq.uncomputed_tokens,
            )
            for rid, seq in ((c.request_id, waiting.get(c.request_id)) for c in plan.prefill)
            if seq is not None
        ]
        cached = self.kv.allocate_batch(fresh)
        prefills: list[tuple[SeqInfo, int]] = []
        for chunk in plan.prefill:
            if chunk.request_id in cached:
                hit = cached[chunk.request_id]
                if hit is None:
                    continue  # the policy's KV estimate was optimistic; it waits a step
                seq = self.tracker.start(chunk.request_id)
                self.tracker.record_progress(seq, computed=hit)
                timeline = self._timelines[seq.relquery_id]
                if timeline.first_prefill_start is None:
                    timeline.first_prefill_start = start
            else:
                seq = self.tracker.running[chunk.request_id]
            prefills.append((seq, min(chunk.num_tokens, seq.uncomputed_tokens)))
        return prefills

    def _complete_prefill(self, seq: SeqInfo, done: list[str]) -> None:
        """A finished prompt publishes its blocks and samples the first output token."""
        self.kv.publish_prompt(seq.request_id, self._requests[seq.request_id].block_hashes)
        self._timelines[seq.relquery_id].last_prefill_end = self.clock
        self.tracker.record_progress(seq, generated=1)
        self._maybe_finish(seq, done)

    def _maybe_finish(self, seq: SeqInfo, done: list[str]) -> None:
        if seq.output_tokens < self._requests[seq.request_id].output_length:
            return
        self.kv.release(seq.request_id)
        request = self._requests.pop(seq.request_id)
        self.tracker.finish(seq.request_id)
        self._finish(seq.relquery_id, done)
        twins, waiting = self.shared.finished(request.request_id, request.answer_key)
        for twin in twins:  # held while it ran: answered by it, none of its prompt ran
            self.prompt_tokens -= self._requests.pop(twin).prompt_tokens
            self._finish(
                (self.tracker.held.get(twin) or self.tracker.waiting[twin]).relquery_id, done
            )
            self.tracker.finish(twin)
        for relquery_id in waiting:
            self._finish(relquery_id, done)

    def _finish(self, relquery_id: str, done: list[str], answered: int = 1) -> None:
        """`answered` more requests of the relQuery have their answers; at the last one
        it is done now."""
        left = self._unfinished.pop(relquery_id, 0) - answered
        if left > 0:
            self._unfinished[relquery_id] = left
            return
        self._timelines[relquery_id].finish = self.clock
        done.append(relquery_id)

    def _outcome(self, relquery: SimRelQuery, timeline: _Timeline) -> RelQueryOutcome:
        assert timeline.finish is not None
        # A relQuery none of whose requests ran (each followed or cached) has no prefill.
        start = timeline.first_prefill_start
        prefill_end = timeline.last_prefill_end
        latency = LatencyBreakdown.from_timestamps(
            timeline.arrival,
            timeline.arrival if start is None else start,
            timeline.arrival if prefill_end is None else prefill_end,
            timeline.finish,
        )
        met = None if relquery.deadline is None else timeline.finish <= relquery.deadline
        return RelQueryOutcome(
            relquery.relquery_id, len(relquery.requests), relquery.labels, latency, met
        )
