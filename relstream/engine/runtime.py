"""An asyncio relQuery engine over vLLM's AsyncLLM.

Submit a RelQuery, then await its result, iterate its rows as they finish, or cancel it.
Rows are rendered through the model's chat template and tagged with their relQuery so
the scheduler plug-in can group them. A row that cannot run (missing column, empty row,
prompt over the model's limit) comes back as an error for that row only.

Policies: `fcfs` is stock vLLM; `sp` is vLLM's own priority policy fed each relQuery's
static priority (Σ prompt + max output tokens); every other policy runs through
`RelstreamScheduler`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from relstream.model import LatencyBreakdown, RelQuery, RowError
from relstream.scheduler import POLICIES

TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


@dataclass(frozen=True)
class EngineSettings:
    model: str = "smollm2"  # a known model name or a local Hugging Face folder
    policy: str = "relserve"
    max_model_len: int = 2048
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    step_log: Path | None = None
    seed: int = 0
    cpu_kv_cache_gib: int = 2

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"unknown policy {self.policy!r}; choose one of: {', '.join(POLICIES)}"
            )


@dataclass(frozen=True)
class RowResult:
    row_index: int
    row_key: str
    status: str  # "ok", "error" or "cancelled"
    output: str | None = None
    error: str | None = None
    output_tokens: int = 0


@dataclass
class RelQueryResult:
    relquery_id: str
    rows: list[RowResult]  # in row order
    latency: LatencyBreakdown | None  # None when no row ran
    policy: str
    model: str

    @property
    def outputs(self) -> list[str | None]:
        return [row.output for row in self.rows]


@dataclass
class _RowTimes:
    scheduled: float
    first_token: float
    last_token: float


@dataclass
class RelQueryHandle:
    relquery: RelQuery
    submitted_at: float
    _tasks: list[asyncio.Task] = field(default_factory=list)
    _finished: asyncio.Queue = field(default_factory=asyncio.Queue)
    _engine: RelQueryEngine | None = None

    @property
    def relquery_id(self) -> str:
        return self.relquery.id

    async def rows(self) -> AsyncIterator[RowResult]:
        """Rows in the order they finish."""
        for _ in range(len(self._tasks)):
            yield await self._finished.get()

    async def result(self) -> RelQueryResult:
        outcomes = await asyncio.gather(*self._tasks)
        rows = sorted((row for row, _ in outcomes), key=lambda r: r.row_index)
        times = [t for _, t in outcomes if t is not None]
        assert self._engine is not None
        return RelQueryResult(
            self.relquery.id,
            rows,
            _breakdown(self.submitted_at, times),
            self._engine.settings.policy,
            self._engine.model_name,
        )

    async def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _breakdown(arrival: float, times: list[_RowTimes]) -> LatencyBreakdown | None:
    """Paper §2.1 from the engine core's own per-request step timestamps."""
    if not times:
        return None
    start = max(arrival, min(t.scheduled for t in times))
    prefill_end = max(start, max(t.first_token for t in times))
    finish = max(prefill_end, max(t.last_token for t in times))
    return LatencyBreakdown.from_timestamps(arrival, start, prefill_end, finish)


def apply_cpu_defaults(settings: EngineSettings) -> bool:
    """Settings measured on vLLM's CPU build (DESIGN.md); returns True when on CPU.

    LD_PRELOAD of tcmalloc only works from process start: the CLI re-executes itself
    with it (see `relstream.cli`); library users set it themselves."""
    import torch

    if torch.cuda.is_available():
        return False
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(settings.cpu_kv_cache_gib))
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 2))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return True


class RelQueryEngine:
    def __init__(self, settings: EngineSettings, llm, tokenizer, model_name: str) -> None:
        self.settings = settings
        self._llm = llm
        self._tokenizer = tokenizer
        self.model_name = model_name

    @classmethod
    async def start(cls, settings: EngineSettings) -> RelQueryEngine:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from relstream.engine.models import resolve_model

        on_cpu = apply_cpu_defaults(settings)
        model_path = resolve_model(settings.model)
        args = AsyncEngineArgs(
            model=str(model_path),
            dtype="float32" if on_cpu else "auto",
            enforce_eager=on_cpu,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            enable_prefix_caching=True,
            seed=settings.seed,
            disable_log_stats=False,  # per-request step timestamps feed the breakdown
            **_policy_args(settings),
        )
        if on_cpu:
            args.gpu_memory_utilization = 0.3
        llm = AsyncLLM.from_engine_args(args)
        tokenizer = llm.get_tokenizer()
        if asyncio.iscoroutine(tokenizer):
            tokenizer = await tokenizer
        return cls(settings, llm, tokenizer, model_path.name)

    async def __aenter__(self) -> RelQueryEngine:
        return self

    async def __aexit__(self, *exc) -> None:
        self.shutdown()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the engine core process. Idempotent."""
        if self._llm is None:
            return
        self._llm.shutdown(timeout=timeout)
        self._llm = None

    async def reset_prefix_cache(self) -> None:
        """Forget cached prompt blocks (so back-to-back measurements start alike)."""
        await self._llm.reset_prefix_cache()

    async def submit(self, relquery: RelQuery) -> RelQueryHandle:
        handle = RelQueryHandle(relquery, time.monotonic(), _engine=self)
        prepared = [self._prepare_row(relquery, index) for index in range(len(relquery.rows))]
        runnable = sum(1 for p in prepared if isinstance(p, list))
        static_priority = sum(
            len(p) + relquery.max_output_tokens for p in prepared if isinstance(p, list)
        )
        for index, prompt in enumerate(prepared):
            coroutine = self._run_row(handle, index, prompt, runnable, static_priority)
            handle._tasks.append(asyncio.ensure_future(coroutine))
        return handle

    async def run(self, relquery: RelQuery) -> RelQueryResult:
        return await (await self.submit(relquery)).result()

    def _prepare_row(self, relquery: RelQuery, index: int) -> list[int] | str:
        """Token ids of the row's chat prompt, or the reason it cannot run."""
        row = relquery.rows[index]
        if not any(str(v).strip() for v in row.values.values() if v is not None):
            return f"row {row.key!r} is empty"
        try:
            text = relquery.template.render(row.values)
        except RowError as exc:
            return f"row {row.key!r}: {exc}"
        messages = [{"role": "user", "content": text}]
        if relquery.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": relquery.system_prompt})
        chat = self._tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        ids = self._tokenizer.encode(chat, add_special_tokens=False)
        limit = self.settings.max_model_len - relquery.max_output_tokens
        if len(ids) > limit:
            return (
                f"row {row.key!r}: prompt has {len(ids)} tokens; the model allows "
                f"{self.settings.max_model_len} including "
                f"{relquery.max_output_tokens} output tokens"
            )
        return ids

    async def _run_row(
        self,
        handle: RelQueryHandle,
        index: int,
        prompt: list[int] | str,
        runnable: int,
        static_priority: int,
    ) -> tuple[RowResult, _RowTimes | None]:
        from vllm import SamplingParams

        from relstream.engine.vllm_scheduler import relquery_tags

        relquery = handle.relquery
        row = relquery.rows[index]
        times = None
        if isinstance(prompt, str):
            result = RowResult(index, row.key, "error", error=prompt)
        else:
            params = SamplingParams(
                max_tokens=relquery.max_output_tokens,
                temperature=0.0,
                extra_args=relquery_tags(relquery.id, runnable),
            )
            priority = static_priority if self.settings.policy == "sp" else 0
            final = None
            try:
                async for final in self._llm.generate(  # noqa: B007 (the last one is kept)
                    {"prompt_token_ids": prompt},
                    params,
                    f"{relquery.id}#{index}",
                    priority=priority,
                ):
                    pass
            except asyncio.CancelledError:
                result = RowResult(index, row.key, "cancelled", error="relQuery cancelled")
                await handle._finished.put(result)
                raise
            except Exception as exc:  # one failing row must not take the relQuery down
                result = RowResult(index, row.key, "error", error=f"row {row.key!r}: {exc}")
            else:
                completion = final.outputs[0]
                result = RowResult(
                    index, row.key, "ok", completion.text, None, len(completion.token_ids)
                )
                times = _row_times(final)
        await handle._finished.put(result)
        return result, times


def _row_times(output) -> _RowTimes | None:
    stats = getattr(output, "metrics", None)
    if stats is None or not getattr(stats, "scheduled_ts", 0):
        return None
    return _RowTimes(stats.scheduled_ts, stats.first_token_ts, stats.last_token_ts)


def _policy_args(settings: EngineSettings) -> dict:
    """Every policy runs under the plug-in so every run has a step log; for `fcfs` and
    `sp` it only observes, leaving the decisions to vLLM's own scheduler."""
    relstream_config: dict = {"policy": settings.policy}
    if settings.step_log:
        relstream_config["step_log"] = str(settings.step_log)
    args: dict = {
        "scheduler_cls": "relstream.engine.vllm_scheduler.RelstreamScheduler",
        "additional_config": {"relstream": relstream_config},
    }
    if settings.policy == "sp":
        args["scheduling_policy"] = "priority"
    return args
