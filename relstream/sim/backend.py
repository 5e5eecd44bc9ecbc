"""`--backend sim`: the RelQueryBackend contract without a model, for instant runs and tests.

Each row's output is its rendered prompt (so where an answer lands shows which row it
came from), or, where the relQuery gives choices, the choice its prompt hashes to; the
latency breakdown is what the simulator predicts for the relQuery alone on a cost
profile. Rows fail for the same reasons as on the real engine (`prepare_row`, and a
prompt too long for the context: `too_long`, against `allowed_tokens`), each alone.

`relstream engine --backend sim` simulates in child processes (`SimSettings.processes`),
as vLLM computes in its engine core's: tokenizing and simulating a 100,000-row relQuery
is seconds of Python that, in a thread, took the event loop's GIL from it (heartbeats
late, the group rebalancing). The loop's process keeps only the rows' answers; a child
gets the relQuery's prompts as one msgpack blob and returns its latency breakdown.

With a time scale it also takes that time, `speed` times as fast (0.25: a slow engine, for
drills of placement; the result's breakdown stays the profile's), and reports its load as
an engine does: the simulated engine seconds its relQueries have yet to take, at the
profile's prices divided by its speed.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace

import msgspec

from relstream.backend import EngineFailure, backlog_rows_for
from relstream.engine.tokenizer import chatml_prompt, encode_batch
from relstream.model import (
    LatencyBreakdown,
    RelQuery,
    RelQueryResult,
    RowRequest,
    RowResult,
    RowStatus,
    cancelled_result,
    prepare_row,
    too_long,
)
from relstream.outputspec import OutputKind
from relstream.placement.load import CHARS_PER_TOKEN, Load, RecentTemplates, size_counts
from relstream.scheduler import DEFAULT_POLICY, make_policy
from relstream.scheduler.paperlines import Coefficients
from relstream.sim.kvcache import block_hashes
from relstream.sim.profiles import get_profile
from relstream.sim.simulator import SimRelQuery, SimRequest, Simulator

RECENT_REQUESTS = 10_000  # request ids a sim backend remembers (`recent_requests`)
TOKENIZE_BATCH = 256  # prompts tokenized at once
SIM_PROCESSES = 2  # simulating children of `relstream engine --backend sim`
CHILD_NICE = 10  # their nice value, that of the service's worker threads (`service.offloop`)
# What a terminal's Ctrl-C and `timeout` or systemd send to the whole process group: the
# engine's to handle (it stops serving, nothing lost), not its simulating children's.
STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})


@dataclass(frozen=True)
class SimSettings:
    policy: str = DEFAULT_POLICY
    profile: str = "cpu-smollm2"
    time_scale: float = 0.0  # > 0: take this fraction of the simulated latency in real time
    processes: int = 0  # child processes that simulate (0: a thread of this process)
    speed: float = 1.0  # how fast this engine is against its profile (0.25: four times slower)
    max_model_len: int = 2048  # the context a row's prompt and output must fit, as vLLM's

    def __post_init__(self) -> None:
        if not self.speed > 0:
            raise ValueError(f"sim speed must be positive, not {self.speed!r}")


@dataclass(frozen=True)
class LatencyJob:
    """What a child needs to simulate one relQuery alone, beside its runnable rows'
    prompts."""

    profile: str
    policy: str
    relquery_id: str
    system_prompt: str | None
    max_output_tokens: int
    deadline: float | None
    max_model_len: int = 2048


@dataclass(frozen=True)
class Simulated:
    """What a child returns: the relQuery's latency (None: no row could run) and, for
    each prompt too long to ever run, its place among the prompts and its tokens."""

    latency: LatencyBreakdown | None
    too_long: tuple[tuple[int, int], ...] = ()
    prompt_tokens: tuple[int, ...] = ()  # each prompt's tokens, in the prompts' order


def allowed_tokens(profile_name: str, max_model_len: int) -> int:
    """The context a row's prompt and output must fit: the model's, or the profile's
    whole KV cache where that is smaller (a request larger could never be admitted)."""
    return min(max_model_len, get_profile(profile_name).limits.kv_capacity_tokens)


def simulated_latency(job: LatencyJob, prompts: bytes) -> Simulated:
    """`latency_alone`, in a child: the prompts come as one msgpack list (one C call to
    send, not one object a row)."""
    return latency_alone(job, msgspec.msgpack.decode(prompts, type=list[str]))


def latency_alone(job: LatencyJob, prompts: list[str]) -> Simulated:
    """The latency the simulator predicts for the relQuery alone, tokenized in batches:
    the tokenizer holds the GIL while it hands a batch's ids back, and only a batch's ids
    are held at once (a request keeps its length and block hashes). A prompt too long for
    the context (`allowed_tokens`) is left out and named, as vLLM's engine refuses it."""
    profile = get_profile(job.profile)
    block = profile.limits.block_size
    most = allowed_tokens(job.profile, job.max_model_len) - job.max_output_tokens
    requests, too_long, lengths = [], [], []
    for start in range(0, len(prompts), TOKENIZE_BATCH):
        batch = [
            chatml_prompt(p, job.system_prompt) for p in prompts[start : start + TOKENIZE_BATCH]
        ]
        for offset, tokens in enumerate(encode_batch(batch)):
            lengths.append(len(tokens))
            if len(tokens) > most:
                too_long.append((start + offset, len(tokens)))
                continue
            requests.append(
                SimRequest(
                    f"{job.relquery_id}#{start + offset}",
                    len(tokens),
                    block_hashes(tokens, block),
                    job.max_output_tokens,
                )
            )
    if not requests:
        return Simulated(None, tuple(too_long), tuple(lengths))
    engine = Simulator(profile, make_policy(job.policy, profile.prior()))
    simulated = SimRelQuery(
        job.relquery_id, 0.0, job.max_output_tokens, requests, deadline=job.deadline
    )
    latency = engine.run([simulated]).outcomes[0].latency
    return Simulated(latency, tuple(too_long), tuple(lengths))


def _start_child() -> None:
    """A simulating child: out of the engine's process group, so a stop sent to the group
    (Ctrl-C) reaches the engine alone, which ends it (or, killed, takes it along:
    `engine.lifetime`) once what it simulates is done, where dying at once broke the
    pool and read as an engine failure; niced, as the service's worker threads are, so
    where the cores are busy the engine's event loop gets one first; its tokenizer loaded.
    It starts with the stop signals blocked (`SimRelQueryBackend.start`): one sent to the
    group before it left is dropped here."""
    from relstream.engine.tokenizer import load_tokenizer

    os.setpgrp()
    while pending := signal.sigpending() & STOP_SIGNALS:
        signal.sigwait(pending)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    os.nice(CHILD_NICE)
    load_tokenizer()


def _ready() -> None:
    """Nothing: a child answering it has started."""


class SimHandle:
    """A relQuery on the simulated backend: the whole result arrives at once, so a
    cancelled one has every runnable row cancelled."""

    def __init__(
        self, relquery: RelQuery, outcome: asyncio.Future[RelQueryResult], policy: str
    ) -> None:
        self._relquery = relquery
        self._outcome = outcome
        self._policy = policy
        self._cancelled = False

    @property
    def relquery_id(self) -> str:
        return self._relquery.id

    async def rows(self) -> AsyncIterator[RowResult]:
        for row in (await self.result()).rows:
            yield row

    async def result(self) -> RelQueryResult:
        try:
            return await self._outcome
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            return cancelled_result(self._relquery, self._policy, SimRelQueryBackend.model_name)

    async def cancel(self) -> None:
        self._cancelled = True
        self._outcome.cancel()


class SimRelQueryBackend:
    model_name = "sim"

    def __init__(self, settings: SimSettings | None = None) -> None:
        self.settings = settings or SimSettings()
        self.profile = get_profile(self.settings.profile)
        # its profile's prices: an output token's step shared by a full batch
        self._prices = Coefficients.of(self.profile.prior(), self.profile.limits.max_num_seqs)
        # What reached the model: request ids of the latest rows it answered, so a test
        # can tell a row the backend was asked from one it never saw.
        self.recent_requests: deque[str] = deque(maxlen=RECENT_REQUESTS)
        self._pool: ProcessPoolExecutor | None = None
        self._ends: dict[str, float] = {}  # relQuery id -> when it is due, monotonic
        self._templates = RecentTemplates()

    async def start(self) -> None:
        """Start the simulating children, each with its tokenizer loaded, from this
        (the main) thread: a child started from another thread would not die with the
        engine (`engine.lifetime`)."""
        if self.settings.processes < 1 or self._pool is not None:
            return
        from relstream.engine.lifetime import children_die_with_this_process

        children_die_with_this_process()
        context = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(
            self.settings.processes, mp_context=context, initializer=_start_child
        )
        # Each submit here starts a child, which inherits this mask: blocked until it
        # has left the process group. Held here meanwhile, a signal comes after.
        unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            warming = [self._pool.submit(_ready) for _ in range(self.settings.processes)]
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
        await asyncio.gather(*map(asyncio.wrap_future, warming))

    async def submit(self, relquery: RelQuery) -> SimHandle:
        # Counted in the load from now, while it is simulated too (a big one takes
        # seconds): a report does not call this engine idle while it holds work.
        if self.settings.time_scale > 0:
            estimate = self._estimated_s(relquery) * self.settings.time_scale
            self._ends[relquery.id] = time.monotonic() + estimate
        outcome = asyncio.ensure_future(self._serve_in_time(relquery))
        return SimHandle(relquery, outcome, self.settings.policy)

    @property
    def policy(self) -> str:
        return self.settings.policy

    def backlog_rows(self) -> int:
        return backlog_rows_for(self.profile.limits.kv_capacity_tokens)

    def shutdown(self) -> None:
        """Stop the simulating children, dropping what they have not begun, and wait
        for the pool's manager thread: left running into interpreter exit, it closes its
        wake-up pipe while `concurrent.futures` writes to it (CPython 3.11), a traceback
        on stderr. The wait is no longer than the process's own: a thread blocked on a
        job in progress holds the exit as long."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def load(self) -> Load:
        """Engine seconds its relQueries in flight have yet to take, each and together,
        and the profile's prices (an output token's step shared by a full batch), at its
        speed."""
        now, speed, scale = time.monotonic(), self.settings.speed, self.settings.time_scale
        each = [max(due - now, 0.0) / scale for due in self._ends.values()] if scale else []
        left = sum(each, 0.0)
        return Load(
            left,
            self._prices.per_token / speed,
            self._prices.per_output / speed,
            size_counts(each),
            self._templates.ids(),
        )

    def _estimated_s(self, relquery: RelQuery) -> float:
        """Engine seconds, at its speed, a relQuery not yet simulated is counted as in its
        load: its rows' templates and output budgets at the profile's prices (row values
        left out: no walk over its rows on the event loop)."""
        prompt = len(relquery.template.text) // CHARS_PER_TOKEN * self._prices.per_token
        per_row = prompt + relquery.max_output_tokens * self._prices.per_output
        return len(relquery.rows) * per_row / self.settings.speed

    async def _serve_in_time(self, relquery: RelQuery) -> RelQueryResult:
        try:
            result = await asyncio.get_running_loop().run_in_executor(None, self._serve, relquery)
        finally:  # its estimate, counted from submit (or nothing, if it failed)
            self._ends.pop(relquery.id, None)
        if self.settings.time_scale > 0 and result.latency is not None:
            wait = result.latency.total / self.settings.speed * self.settings.time_scale
            self._ends[relquery.id] = time.monotonic() + wait
            try:
                await asyncio.sleep(wait)
            finally:
                self._ends.pop(relquery.id, None)
        self._templates.note(relquery.template.text)
        return result

    def _serve(self, relquery: RelQuery) -> RelQueryResult:
        rows: list[RowResult] = []
        runnable: list[RowRequest] = []
        for index in range(len(relquery.rows)):
            prepared = prepare_row(relquery, index)
            if isinstance(prepared, RowRequest):
                runnable.append(prepared)
                self.recent_requests.append(prepared.request_id)
                rows.append(
                    RowResult(
                        index, prepared.row_key, RowStatus.OK, answer(relquery, prepared), None, 1
                    )
                )
            else:
                rows.append(RowResult.failed(prepared))
        simulated = self._simulate(relquery, runnable) if runnable else Simulated(None)
        allowed = allowed_tokens(self.settings.profile, self.settings.max_model_len)
        for place, tokens in simulated.too_long:  # never run: an error naming the limit
            request = runnable[place]
            failure = too_long(
                request.row_index, request.row_key, tokens, allowed, relquery.max_output_tokens
            )
            rows[request.row_index] = RowResult.failed(failure)
        for request, tokens in zip(runnable, simulated.prompt_tokens, strict=True):
            if rows[request.row_index].status is RowStatus.OK:  # its prompt, as vLLM's
                rows[request.row_index] = replace(rows[request.row_index], prompt_tokens=tokens)
        return RelQueryResult(
            relquery.id, rows, simulated.latency, self.settings.policy, self.model_name
        )

    def _simulate(self, relquery: RelQuery, runnable: list[RowRequest]) -> Simulated:
        """In a child when there are children (this thread waits for it), else here."""
        prompts = [request.prompt for request in runnable]
        job = LatencyJob(
            self.settings.profile,
            self.settings.policy,
            relquery.id,
            relquery.system_prompt,
            relquery.max_output_tokens,
            relquery.deadline_s,
            self.settings.max_model_len,
        )
        if self._pool is None:
            return latency_alone(job, prompts)
        blob = msgspec.msgpack.encode(prompts)
        try:
            return self._pool.submit(simulated_latency, job, blob).result()
        except BrokenProcessPool as exc:  # a child died: the engine's core is gone
            raise EngineFailure(f"a simulating process died: {exc}") from exc


def answer(relquery: RelQuery, request: RowRequest) -> str:
    """The simulated answer: the prompt, or a choice picked by the prompt's hash."""
    output = relquery.output
    if output is not None and output.kind is OutputKind.CHOICES:
        return output.choices[zlib.crc32(request.prompt.encode()) % len(output.choices)]
    return request.prompt
