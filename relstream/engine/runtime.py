"""Service process: the vLLM runtime (`VllmRuntime`), relQueries over vLLM's AsyncLLM.

On the service's event loop: submit a RelQuery, then await its result, iterate its rows
as they finish, or cancel it. Rows are rendered through the model's chat template and
tagged with their relQuery (`engine/tags.py`) so the scheduler plug-in can group them. A
row that cannot run (missing column, empty row, prompt over the model's limit) comes
back as an error for that row only.

Every policy runs under relstream's plug-in, which vLLM loads in its engine core process
(`relstream.engine.core.plugin`, named only by `tags.PLUGIN_CLASS`), so every run
can write a step log; the registry (`relstream.scheduler.registry`) says which policies
stock vLLM decides itself (`v1-fcfs`; `v1-priority` on vLLM's priority queue, fed each
relQuery's static priority) and which the plug-in decides (every other one).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from relstream.backend import EngineFailure, backlog_rows_for
from relstream.engine.answers import AnswerCache, SharedOutcome, request_key
from relstream.engine.cpu import CPU_GPU_MEMORY_UTILIZATION, apply_cpu_defaults
from relstream.engine.handle import EngineHandle
from relstream.engine.identity import ModelIdentity, engine_identity
from relstream.engine.requests import (
    RowTimes,
    TokenizedRow,
    answered_row,
    prompt_order,
    row_times,
    sampling_params,
    seconds_left,
    tokenize_row,
)
from relstream.engine.tags import PLUGIN_CLASS, SETTINGS_KEY, read_load, relquery_tags
from relstream.engine.twins import Role, SharedRequests
from relstream.model import (
    RelQuery,
    RowFailure,
    RowResult,
    RowStatus,
)
from relstream.placement.load import Load, RecentTemplates
from relstream.scheduler import (
    COST_MODEL_KINDS,
    DEFAULT_POLICY,
    VllmQueue,
    check_fair_share,
    holds_twins,
    policy_spec,
    static_priority,
    vllm_priority,
)

SUBMIT_ROWS_PER_SLICE = 32  # rows tokenized between two yields to the loop (~0.1 ms each)
STALE_LOAD_S = 10.0  # with rows in flight, a load written longer ago is not reported


@dataclass(frozen=True)
class EngineSettings:
    model: str = "smollm2"  # a known model name, a local HF folder or a Hub id
    policy: str = DEFAULT_POLICY
    max_model_len: int = 2048
    gpu_memory_utilization: float | None = None  # GPU share for weights and KV (vLLM: 0.9)
    tensor_parallel_size: int = 1  # GPUs the model is split over
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    step_log: Path | None = None
    seed: int = 0
    cpu_kv_cache_gib: int = 2
    # The policy's step-cost lines: refit "online" from every step, or kept "fixed" at
    # `cost_prior` (alpha_p, beta_p, alpha_d, beta_d), as the paper profiles offline.
    cost_model: str = "online"
    cost_prior: dict[str, float] | None = None
    # Bytes of answers kept for identical deterministic requests across windows (0: off).
    answer_cache_bytes: int = 0
    # Identical deterministic requests computed once (and answered from the cache, if
    # any); off, every row runs as stock vLLM runs it (benchmarks compare the two).
    share_identical: bool = True
    prefix_caching: bool = True  # vLLM's: rows sharing a prompt prefix compute it once
    # The plug-in writes its policy's load for the engine's load reports (`load()`); off,
    # it computes none (benchmarks time the policy alone).
    report_load: bool = False
    fair_share: dict[str, float] | None = None  # weights by query (`fairshare`); None: off

    def __post_init__(self) -> None:
        policy_spec(self.policy)  # raises, naming the known policies
        check_fair_share(self.policy, self.fair_share)
        if self.cost_model not in COST_MODEL_KINDS:
            raise ValueError(f"cost_model must be 'online' or 'fixed', not {self.cost_model!r}")


class VllmRuntime:
    def __init__(
        self,
        settings: EngineSettings,
        llm,
        tokenizer,
        model_name: str,
        identity: ModelIdentity,
        load_file: Path | None = None,
    ) -> None:
        self.settings = settings
        self._llm = llm
        self._tokenizer = tokenizer
        self.model_name = model_name
        self.identity = identity  # what request keys name: never another model's answers
        # Identical requests in flight computed once; finished answers kept if asked for.
        cache_bytes = settings.answer_cache_bytes
        cache = AnswerCache(cache_bytes, identity.model, identity.digest) if cache_bytes else None
        self._shared = SharedRequests(cache, holds_twins(settings.policy))
        self._load_file = load_file  # where the plug-in writes the policy's load
        self._rows_in_flight = 0
        self._templates = RecentTemplates()

    @classmethod
    async def start(cls, settings: EngineSettings) -> VllmRuntime:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from relstream.engine.lifetime import children_die_with_this_process
        from relstream.engine.weights import KNOWN_MODELS, resolve_model

        children_die_with_this_process()  # vLLM's processes too: no orphan outlives a kill
        on_cpu = apply_cpu_defaults(settings.cpu_kv_cache_gib)
        model = resolve_model(settings.model)
        load_file = None
        if settings.report_load:
            load_file = Path(tempfile.mkdtemp(prefix="relstream-load-")) / "load.json"
        args = AsyncEngineArgs(
            model=model,
            tensor_parallel_size=settings.tensor_parallel_size,
            dtype="float32" if on_cpu else "auto",
            enforce_eager=on_cpu,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            enable_prefix_caching=settings.prefix_caching,
            seed=settings.seed,
            disable_log_stats=False,  # per-request step timestamps feed the breakdown
            **_policy_args(settings, load_file),
        )
        if on_cpu:
            args.gpu_memory_utilization = CPU_GPU_MEMORY_UTILIZATION
        elif settings.gpu_memory_utilization is not None:
            args.gpu_memory_utilization = settings.gpu_memory_utilization
        llm = None
        try:
            llm = AsyncLLM.from_engine_args(args)
            tokenizer = llm.get_tokenizer()
            if asyncio.iscoroutine(tokenizer):
                tokenizer = await tokenizer
            # The full id: a known model's name or a Hub id, else the resolved folder's path.
            model_id = settings.model if settings.model in KNOWN_MODELS else model
            identity = engine_identity(llm, tokenizer, model_id, model)
        except BaseException:
            if llm is not None:
                llm.shutdown()
            if load_file is not None:
                shutil.rmtree(load_file.parent, ignore_errors=True)
            raise
        name = model.rstrip("/").rsplit("/", 1)[-1]
        return cls(settings, llm, tokenizer, name, identity, load_file)

    async def __aenter__(self) -> VllmRuntime:
        return self

    async def __aexit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine core process. Idempotent."""
        if self._llm is None:
            return
        llm, self._llm = self._llm, None
        llm.shutdown(timeout=timeout)
        # AsyncLLM's __del__ shuts it down again. When it runs at the interpreter's exit
        # (an exception's traceback can keep the object alive until then), vLLM's module
        # globals are already gone and it prints a TypeError traceback: it is done.
        llm.shutdown = _already_shut_down
        if self._load_file is not None:
            shutil.rmtree(self._load_file.parent, ignore_errors=True)

    @property
    def policy(self) -> str:
        return self.settings.policy

    def backlog_rows(self) -> int:
        cache = self._llm.vllm_config.cache_config
        return backlog_rows_for((cache.num_gpu_blocks or 0) * cache.block_size)

    def load(self) -> Load | None:
        """The policy's outstanding work and prices, as the plug-in last wrote them (None:
        none written yet, or not asked for, `report_load`, or none for STALE_LOAD_S while
        rows are in flight: the placer then stops choosing it); no row in flight, no work."""
        read = read_load(self._load_file) if self._load_file is not None else None
        if read is None:
            return None
        at, written = read
        busy = self._rows_in_flight > 0
        if busy and time.monotonic() - at > STALE_LOAD_S:
            return None  # an engine core that wrote nothing for so long is not stepping
        idle = {} if busy else {"outstanding_s": 0.0, "size_counts": (), "class_work": ()}
        return msgspec.structs.replace(written, templates=self._templates.ids(), **idle)

    async def reset_prefix_cache(self) -> None:
        """Forget cached prompt blocks (so back-to-back measurements start alike)."""
        await self._llm.reset_prefix_cache()

    async def submit(self, relquery: RelQuery) -> EngineHandle:
        handle = EngineHandle(relquery, time.monotonic(), self.policy, self.model_name)
        self._templates.note(relquery.template.text)
        max_len = self.settings.max_model_len
        # Tokenizing rows yields to the loop between slices; taking roles and starting rows
        # does not, so no leader is left without its row's task.
        prepared, keys = [], []
        for index in range(len(relquery.rows)):
            if index and index % SUBMIT_ROWS_PER_SLICE == 0:
                await asyncio.sleep(0)
            prepared.append(row := tokenize_row(self._tokenizer, relquery, index, max_len))
            shares = isinstance(row, TokenizedRow) and self.settings.share_identical
            keys.append(shares and request_key(relquery, row.token_ids, self.identity.digest))
        roles = [self._shared.role(key or None, relquery.id) for key in keys]
        # What vLLM will compute for it: the runnable rows that lead (the others follow
        # one of its rows or come from the answer cache).
        leading = [
            row for row, role in zip(prepared, roles, strict=True)
            if role.leads and role.cached is None and isinstance(row, TokenizedRow)
        ]  # fmt: skip
        priority = 0
        if policy_spec(self.settings.policy).vllm_queue is VllmQueue.PRIORITY:
            prompt_tokens = sum(len(row.token_ids) for row in leading)
            static = static_priority(prompt_tokens, len(leading), relquery.max_output_tokens)
            priority = vllm_priority(relquery.priority, static)
        # Rows reach vLLM in prompt order, so rows sharing a prefix are admitted together
        # and compute it once; results still come back in the user's row order.
        for row, role in sorted(zip(prepared, roles, strict=True), key=prompt_order):
            task = asyncio.ensure_future(self._run_row(handle, row, len(leading), priority, role))
            if role.leads:  # cancelled before it ran, it still releases its followers
                task.add_done_callback(lambda _task, role=role: self._shared.settle(role, None))
            handle._tasks.append(task)
            self._rows_in_flight += 1
            task.add_done_callback(self._row_done)
        return handle

    def _row_done(self, _task: asyncio.Task) -> None:
        self._rows_in_flight -= 1

    @property
    def rows_shared(self) -> int:
        """Rows answered by an identical row's request instead of one of their own."""
        return self._shared.followed

    @property
    def answer_cache(self) -> AnswerCache | None:
        return self._shared.cache

    async def _run_row(
        self,
        handle: EngineHandle,
        row: TokenizedRow | RowFailure,
        runnable: int,
        priority: int,
        role: Role,
    ) -> tuple[RowResult, RowTimes | None]:
        if isinstance(row, RowFailure):
            result, times = RowResult.failed(row), None
        else:
            result, times = await self._answer(handle, row, runnable, priority, role)
        await handle._finished.put(result)
        return result, times

    async def _answer(
        self, handle: EngineHandle, row: TokenizedRow, runnable: int, priority: int, role: Role
    ) -> tuple[RowResult, RowTimes | None]:
        """The row's answer: cached, its own request's, or its leader's (else it leads)."""
        relquery = handle.relquery
        while True:
            if role.cached is not None:
                return answered_row(relquery, row.request, role.cached, True), None
            if role.leads:
                return await self._lead(handle, row, runnable, priority, role)
            try:
                answer = await self._shared.answer_of(role)
            except asyncio.CancelledError:  # its relQuery was cancelled; the others run on
                return RowResult.cancelled(row.request), None
            if answer is not None:
                return answered_row(relquery, row.request, answer, shared=True), answer.times
            role = self._shared.role(role.key, relquery.id)

    async def _lead(
        self, handle: EngineHandle, row: TokenizedRow, runnable: int, priority: int, role: Role
    ) -> tuple[RowResult, RowTimes | None]:
        """The row's own request, raced against its twins': the key's first answer
        serves it, and a twin's cancels this request (vLLM aborts it, held or not)."""
        future, task = role.future, asyncio.current_task()
        if future is None or task is None:
            return await self._generate(handle, row, runnable, priority, role)

        def on_answer(done: asyncio.Future) -> None:
            if not role.settled and done.result() is not None:  # another twin's answer
                task.cancel()

        future.add_done_callback(on_answer)
        try:
            outcome = await self._generate(handle, row, runnable, priority, role)
        finally:
            future.remove_done_callback(on_answer)
        if outcome[0].status is RowStatus.CANCELLED and future.done() and future.result():
            answer = await self._shared.answer_of(role)
            assert answer is not None
            return answered_row(handle.relquery, row.request, answer, shared=True), answer.times
        return outcome

    async def _generate(
        self,
        handle: EngineHandle,
        row: TokenizedRow,
        runnable: int,
        priority: int,
        role: Role,
    ) -> tuple[RowResult, RowTimes | None]:
        """The row's own vLLM request; as a leader, its answer goes to its followers."""
        from vllm.exceptions import VLLMClientError

        # What vLLM raises about a request itself (validation, a bad parameter); anything
        # else is the engine's own failure.
        row_errors = (ValueError, VLLMClientError)
        relquery, request = handle.relquery, row.request
        share = role.key.digest.hex() if role.key is not None else None
        deadline_in = seconds_left(relquery, handle.submitted_at)
        tags = relquery_tags(relquery.id, runnable, deadline_in, share, relquery.priority)
        params = sampling_params(relquery, tags)
        prompt: dict = {"prompt_token_ids": row.token_ids}
        if relquery.cache_salt is not None:  # a tenant's own prefix cache too
            prompt["cache_salt"] = relquery.cache_salt
        final = None
        try:
            async for final in self._llm.generate(  # noqa: B007 (the last one is kept)
                prompt, params, request.request_id, priority=priority
            ):
                pass
        except asyncio.CancelledError:
            # vLLM aborted the request as the cancellation passed through generate();
            # the row is reported, not raised, so the relQuery's result still comes.
            return RowResult.cancelled(request), None
        except row_errors as exc:  # the engine refused this row: the row's error
            error = f"row {request.row_key!r}: {exc}"
            return RowResult(request.row_index, request.row_key, RowStatus.ERROR, error=error), None
        except Exception as exc:  # the engine failed: no row is to blame
            failure = EngineFailure(f"vLLM failed serving {request.request_id}: {exc!r}")
            await handle._finished.put(failure)
            raise failure from exc
        finally:
            answer = None
            if final is not None and final.finished:
                completion = final.outputs[0]
                answer = SharedOutcome(
                    completion.text,
                    len(completion.token_ids),
                    row_times(final),
                    completion.finish_reason,
                )
            self._shared.settle(role, answer)
        # vLLM's own counts for the request (its RequestOutput's), the row's prompt else
        prompt = len(getattr(final, "prompt_token_ids", None) or row.token_ids)
        cached = getattr(final, "num_cached_tokens", None) or 0
        return answered_row(relquery, request, answer, False, False, prompt, cached), answer.times


def _already_shut_down(*_args: object, **_kwargs: object) -> None:
    """What AsyncLLM.shutdown becomes once relstream has shut the engine down."""


def _policy_args(settings: EngineSettings, load_file: Path | None) -> dict:
    """Every policy runs under the plug-in so every run has a step log and its load
    written for reports; for the policies stock vLLM decides itself it only observes."""
    relstream_config: dict = {"policy": settings.policy, "cost_model": settings.cost_model,
                              "fair_share": settings.fair_share}  # fmt: skip
    if load_file is not None:
        relstream_config["load_file"] = str(load_file)
    if settings.cost_prior:
        relstream_config["cost_prior"] = dict(settings.cost_prior)
    if settings.step_log:
        relstream_config["step_log"] = str(settings.step_log)
    return {
        "scheduler_cls": PLUGIN_CLASS,
        "additional_config": {SETTINGS_KEY: relstream_config},
        "scheduling_policy": policy_spec(settings.policy).vllm_queue.value,
    }
