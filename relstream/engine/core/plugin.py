"""Engine core: the relstream policy inside vLLM V1 (engine arg `scheduler_cls`).

A subclass of vLLM's Scheduler, or of its AsyncScheduler where vLLM schedules ahead
(`relstream_scheduler`), loaded by vLLM in its engine core process from the dotted path
`tags.PLUGIN_CLASS`; it shares nothing with the service's process but `engine/tags.py`.

vLLM's `schedule()` still does the work (KV allocation, prefix caching, chunking,
preemption); this class decides *which* requests it may touch each step, by swapping in
a running list and a waiting queue of exactly the planned requests around it:

  decode-only   running = the planned decodes, waiting = empty
  prefill-only  running = unfinished prefills in the plan, waiting = the planned requests
  mixed         both (sarathi)

Policies stock vLLM decides itself (`registry`: `v1-fcfs`, `v1-priority` on vLLM's
priority queue with each request's static priority) are only observed; what the others
cannot honour is refused (`refusals`). Settings (`additional_config[tags.SETTINGS_KEY]`):
{"policy", "step_log": path or None, "cost_prior": {"alpha_p", "beta_p", "alpha_d",
"beta_d"}, "cost_model": "online" (refit every step) or "fixed" (the prior kept, as the
paper profiles offline), "load_file": path or None (the policy's load for the engine's
load reports, `loadwriter`), "fair_share": {query: weight} or None}.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict
from typing import Any

import msgspec
import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import Request, RequestStatus

from relstream.engine.core.loadwriter import LoadWriter
from relstream.engine.core.refusals import Refused, config_conflict
from relstream.engine.core.runninglimits import within_max_loras
from relstream.engine.core.waitqueue import IndexedWaitingQueue
from relstream.engine.tags import EXTRA_ARGS_KEY, SETTINGS_KEY
from relstream.scheduler import (
    DEFAULT_POLICY,
    CostModel,
    EngineView,
    cost_model_of,
    make_policy,
    policy_spec,
)
from relstream.scheduler.data import EngineLimits, SeqInfo, StepKind, StepPlan
from relstream.scheduler.registry import queue_conflict
from relstream.scheduler.steprecord import StepLogStart, StepRecord, encode_line
from relstream.scheduler.tracker import RequestTracker

# Until the online fit has seen steps: the CPU build's first step costs
# (docs/architecture/scheduler.md)
DEFAULT_PRIOR = {"alpha_p": 1.3e-3, "beta_p": 0.020, "alpha_d": 1.8e-3, "beta_d": 0.047}
MAX_PENDING_STEPS = 4
log = logging.getLogger("relstream.plugin")
# How a request ends with the answer its twins share (`SeqInfo.share`).
ANSWERED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH_CAPPED})


def step_clock() -> float:
    """What steps are timed by (a test swaps in its own)."""
    return time.perf_counter()


def relstream_scheduler(*, vllm_config, **kwargs) -> Scheduler:
    """What vLLM calls as `scheduler_cls`: the plug-in on vLLM's AsyncScheduler where
    vLLM schedules the next step while the current one runs (GPUs), on the plain
    Scheduler where it does not (the CPU platform turns async scheduling off)."""
    plugin = scheduler_class(bool(vllm_config.scheduler_config.async_scheduling))
    return plugin(vllm_config=vllm_config, **kwargs)


def scheduler_class(async_scheduling: bool) -> type[Scheduler]:
    return RelstreamAsyncScheduler if async_scheduling else RelstreamScheduler


class RelstreamPlugin(EngineView):
    """The plug-in's behaviour, mixed into one of vLLM's scheduler classes below."""

    _aside = (0, 0)  # (running, waiting) requests set aside while a plan is enforced

    def __init__(self, vllm_config, kv_cache_config, *args, **kwargs) -> None:
        settings = dict((vllm_config.additional_config or {}).get(SETTINGS_KEY, {}))
        self.policy_name = settings.get("policy", DEFAULT_POLICY)
        self.decided_by_vllm = policy_spec(self.policy_name).decided_by_vllm is not None
        refused = None if self.decided_by_vllm else config_conflict(self.policy_name, vllm_config)
        if refused:
            raise ValueError(refused)  # before vLLM builds what it names
        super().__init__(vllm_config, kv_cache_config, *args, **kwargs)
        self._refused = Refused(self.policy_name)  # requests it cannot serve (`refusals`)
        if conflict := queue_conflict(self.policy_name, self.policy.value):
            raise ValueError(conflict)
        prior = {**DEFAULT_PRIOR, **settings.get("cost_prior", {})}
        cost_model, fair = settings.get("cost_model", "online"), settings.get("fair_share")
        cost = cost_model_of(cost_model, CostModel.from_coefficients(prior))
        if not self.decided_by_vllm and self.policy == SchedulingPolicy.FCFS:
            # Each step's admissions leave the waiting queue (`_schedule_plan`): vLLM's
            # deque removes by rebuilding itself, this queue in what it removes.
            self.waiting = IndexedWaitingQueue(self.waiting)
        self.relstream_policy = make_policy(self.policy_name, cost, fair_weights=fair)
        self.tracker = RequestTracker()
        self.limits = EngineLimits(
            max_num_seqs=min(self.max_num_running_reqs, self.max_num_active_reqs),
            max_num_batched_tokens=self.scheduler_config.max_num_batched_tokens,
            kv_capacity_tokens=kv_cache_config.num_blocks * self.block_size,
            block_size=self.block_size,
            long_prefill_token_threshold=self.scheduler_config.long_prefill_token_threshold,
            long_prefill_adaptive=getattr(self, "adaptive_long_prefill_threshold", False),
            watermark_kv_tokens=self.kv_cache_manager.watermark_blocks * self.block_size,
        )
        self._load_failed = False  # pricing the load raised once (logged once)
        load_path = settings.get("load_file")  # where the runtime reads the policy's load
        self._load_file = LoadWriter(load_path) if load_path else None
        # An idle engine core never schedules, so its first load, none at the prior's
        # prices, is written now: an engine that has served nothing yet reports too.
        self._write_load()
        log_path = settings.get("step_log")
        self._step_log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115
        if self._step_log:
            header = StepLogStart(
                vllm=vllm.__version__,
                scheduler=type(self).__name__,
                policy=self.policy_name,
                limits=asdict(self.limits),
                cost_model=cost_model,
                cost_prior=prior,
            )
            self._step_log.write(encode_line(header))
        # Steps scheduled and not yet reported back, by their SchedulerOutput: one at a
        # time on the plain Scheduler, two when async scheduling plans a step ahead.
        self._pending: dict[int, tuple[StepRecord, float]] = {}  # and when it started
        self._last_reported = 0.0  # step_clock() when the previous step's output came
        self._hits: dict[str, Any] | None = None  # prefix-cache hits, while a policy plans

    # EngineView
    def now(self) -> float:
        return time.monotonic()

    def cached_prompt_tokens(self, seq: SeqInfo) -> int:
        request = self.requests[seq.request_id]
        if request.num_computed_tokens:
            return 0
        return self._computed_blocks(request)[1]

    def free_kv_tokens(self) -> int:
        return self.kv_cache_manager.block_pool.get_num_free_blocks() * self.block_size

    def admission_kv_tokens(self, seq: SeqInfo, cached_tokens: int) -> int:
        """As the view's, plus the cached blocks nobody holds: a hit on one still takes it
        out of the free pool, and vLLM counts it so (it saves computing, not room)."""
        need = super().admission_kv_tokens(seq, cached_tokens)
        request = self.requests[seq.request_id]
        if not cached_tokens or request.num_computed_tokens:
            return need
        blocks = self._computed_blocks(request)[0].blocks
        free_hits = sum(block.ref_cnt == 0 and not block.is_null for block in blocks[0])
        return need + free_hits * self.block_size

    def _computed_blocks(self, request: Request):
        """vLLM's prefix-cache hit for `request`, looked up once a decision: the cache
        does not change while the policy plans, which asks of a row when it prices its
        relQuery and again when it admits it (`_hits`)."""
        hits = self._hits
        if hits is None:
            return self.kv_cache_manager.get_computed_blocks(request)
        hit = hits.get(request.request_id)
        if hit is None:
            hit = hits[request.request_id] = self.kv_cache_manager.get_computed_blocks(request)
        return hit

    # request lifecycle
    def add_request(self, request: Request) -> None:
        known = request.request_id in self.requests
        super().add_request(request)
        if known:
            return
        if not self.decided_by_vllm and self._refused.check(request):
            return
        extra = (request.sampling_params.extra_args or {}) if request.sampling_params else {}
        tags = extra.get(EXTRA_ARGS_KEY, {})
        seq = SeqInfo(
            request_id=request.request_id,
            relquery_id=str(tags.get("relquery_id", request.request_id)),
            prompt_tokens=request.num_prompt_tokens,
            max_tokens=request.max_tokens,
            arrival_time=time.monotonic(),
        )
        if tags.get("deadline_in_s") is not None:
            seq.deadline = seq.arrival_time + float(tags["deadline_in_s"])
        seq.priority, seq.query = int(tags.get("priority", 0)), str(tags.get("query", ""))
        if not self.decided_by_vllm:  # stock vLLM's own queue would run held twins
            seq.share = tags.get("share")
        self.tracker.add_request(seq, int(tags.get("relquery_size", 1)))

    def _free_request(self, request: Request, delay_free_blocks: bool = False):
        if request.request_id in self.tracker:
            self.tracker.finish(request.request_id, answered=request.status in ANSWERED)
        freed = super()._free_request(request, delay_free_blocks)
        self._write_load()  # the last request gone (aborted too): no step may follow
        return freed

    # scheduling
    def schedule(self, throttle_prefills: bool = False):
        started = step_clock()
        self._sync_progress()
        if self.decided_by_vllm:
            decided = step_clock()
            output = super().schedule(throttle_prefills)
        else:
            self._hits = {}
            try:
                plan = self.tracker.unshared(self.relstream_policy.plan(self))
            finally:
                self._hits = None
            decided = step_clock()
            output = self._schedule_plan(plan, throttle_prefills)
        admitted = self._sync_membership(output)
        started_at = step_clock()
        pending = msgspec.structs.replace(
            self._composition(output),
            admitted=admitted,
            decision=None if self.decided_by_vllm else self.relstream_policy.decision,
            decision_s=decided - started,
            adapter_s=started_at - decided,
        )
        self._pending[id(output)] = (pending, started_at)
        while len(self._pending) > MAX_PENDING_STEPS:  # a step vLLM never reported back
            del self._pending[next(iter(self._pending))]
        return output

    def update_from_output(self, scheduler_output, model_runner_output):
        pending, started_at = self._pending.pop(id(scheduler_output), (None, 0.0))
        reported, previous = step_clock(), self._last_reported
        self._last_reported = reported
        if pending is not None and scheduler_output.total_num_scheduled_tokens:
            # Async scheduling plans step N+1 while step N runs: N+1 runs only once N's
            # output is back, so it is timed from the later of the two (else every step
            # would be counted from its planning and span about two steps).
            duration = reported - max(started_at, previous)
            self.relstream_policy.observe(pending.feedback(duration))
            if self._step_log:
                record = msgspec.structs.replace(
                    pending,
                    duration_s=duration,
                    waiting=len(self.tracker.waiting),
                    running=len(self.tracker.running),
                    held=len(self.tracker.held),
                    t=time.monotonic(),
                )
                self._step_log.write(encode_line(record))
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self._refused.finish(self, outputs)
        self._write_load()
        return outputs

    def _write_load(self) -> None:
        """The policy's load for the engine's reports (`loadwriter`), at most every
        WRITE_EVERY_S (longer where pricing it is slow) and as soon as none is left."""
        tracker, load_file = self.tracker, self._load_file
        idle = not (tracker.waiting or tracker.running or tracker.held)
        if load_file is None or not load_file.due(time.monotonic(), idle):
            return
        started = time.perf_counter()
        try:
            load = self.relstream_policy.load(self)
        except Exception:  # a report is best effort: the scheduler must not fail for it
            if not self._load_failed:
                log.exception("pricing the load for the engine's reports failed")
            self._load_failed = True
            return
        load_file.write(load, time.perf_counter() - started, idle)

    def shutdown(self) -> None:
        if self._step_log:
            self._step_log.close()
            self._step_log = None
        super().shutdown()

    def get_request_counts(self) -> tuple[int, int]:
        """vLLM's counts with the requests a plan set aside, so its long-prefill
        threshold (off for a lone request) applies as planned."""
        running, waiting = super().get_request_counts()
        return running + self._aside[0], waiting + self._aside[1]

    def _schedule_plan(self, plan: StepPlan, throttle_prefills: bool):
        planned = {chunk.request_id for chunk in plan.prefill} | set(plan.decode)
        for request_id in plan.preempt:
            self._evict(request_id)
        chosen = [
            self.requests[chunk.request_id]
            for chunk in plan.prefill
            if chunk.request_id in self.tracker.waiting and chunk.request_id in self.requests
        ]
        chosen = within_max_loras(chosen, self.running, self.lora_config)
        # vLLM computes running requests in list order: the plan's, best-ranked prompts first.
        order = [*plan.decode, *(chunk.request_id for chunk in plan.prefill)]
        position = {request_id: i for i, request_id in enumerate(order)}
        kept = [r for r in self.running if r.request_id in planned]
        kept.sort(key=lambda r: position[r.request_id])
        held = [r for r in self.running if r.request_id not in planned]
        waiting, kv_holding = self.waiting, self.kv_holding_waiting
        # One holding KV (an async load) stays in the queue vLLM drains first and promotes.
        holds = {r for r in chosen if r in kv_holding} if kv_holding else set()
        if chosen:  # O(chosen) on the indexed queue; vLLM's rebuilds itself
            waiting.remove_requests([r for r in chosen if r not in holds])
            kv_holding.remove_requests(holds)
        self.waiting = create_request_queue(self.policy)
        self.kv_holding_waiting = create_request_queue(self.policy)
        for request in chosen:
            (self.kv_holding_waiting if request in holds else self.waiting).add_request(request)
        self.running = kept
        self._aside = (len(held), len(waiting) + len(kv_holding))
        full = self.max_num_scheduled_tokens  # a background step's cut budget (`classes`)
        self.max_num_scheduled_tokens = min(plan.budget or full, full)
        try:
            return super().schedule(throttle_prefills)
        finally:
            del self._aside
            self.max_num_scheduled_tokens = full
            # Unadmitted planned requests and anything vLLM preempted go back in front.
            leftover, leftover_kv = list(self.waiting), list(self.kv_holding_waiting)
            self.running = held + self.running
            self.waiting, self.kv_holding_waiting = waiting, kv_holding
            self.waiting.prepend_requests(reversed(leftover))
            self.kv_holding_waiting.prepend_requests(reversed(leftover_kv))

    def _evict(self, request_id: str) -> None:
        request = self.requests[request_id]
        self.running.remove(request)
        # As vLLM's own; with no KV connector (`refusals`) no output is stale, no free late.
        self._preempt_request(request, time.monotonic())

    def _sync_progress(self) -> None:
        for request_id, seq in self.tracker.running.items():
            request = self.requests.get(request_id)
            if request is None:
                continue
            # Async scheduling: outputs of steps still in flight count as generated, as
            # vLLM counts them (their placeholders) when it decides what may run.
            computed = request.num_computed_tokens
            generated = request.num_output_tokens + request.num_output_placeholders
            if computed != seq.computed_tokens or generated != seq.output_tokens:
                self.tracker.record_progress(
                    seq, computed - seq.computed_tokens, generated - seq.output_tokens
                )

    def _sync_membership(self, output) -> list[str]:
        """Mirror vLLM's admissions and preemptions into the tracker; returns the
        relQueries that had a request admitted this step, in admission order."""
        for request_id in output.preempted_req_ids or ():
            if request_id in self.tracker.running:
                self.tracker.requeue(request_id)
        admitted: dict[str, None] = {}
        for request_id in output.num_scheduled_tokens:
            if request_id in self.tracker.waiting:
                seq = self.tracker.start(request_id)
                request = self.requests[request_id]
                self.tracker.record_progress(seq, request.num_computed_tokens - seq.computed_tokens)
                admitted[seq.relquery_id] = None
        return list(admitted)

    def _composition(self, output) -> StepRecord:
        """What the step computes, for the cost fit and the step log: prompt tokens and
        the requests they belong to, decodes, and the KV context each side attends to."""
        uncached = decodes = prefills = decode_context = prefill_context = 0
        for request_id, tokens in output.num_scheduled_tokens.items():
            seq = self.tracker.running.get(request_id)
            request = self.requests.get(request_id)
            # schedule() has already advanced num_computed_tokens past this step's tokens.
            context = request.num_computed_tokens - tokens if request is not None else 0
            if seq is not None and seq.prefill_done and tokens == 1:
                decodes += 1
                decode_context += context
            else:
                uncached += tokens
                prefills += 1
                prefill_context += context
        return StepRecord(
            kind=StepKind.of(bool(uncached), bool(decodes)),
            uncached_tokens=uncached,
            decode_requests=decodes,
            prefill_requests=prefills,
            decode_context_tokens=decode_context,
            prefill_context_tokens=prefill_context,
        )


class RelstreamScheduler(RelstreamPlugin, Scheduler):
    """The plug-in on vLLM's synchronous Scheduler."""


class RelstreamAsyncScheduler(RelstreamPlugin, AsyncScheduler):
    """The plug-in on vLLM's AsyncScheduler (scheduling overlapped with the forward pass)."""
