"""`relstream engine`: serve the relqueries topic and publish results.

Exactly once where the broker has transactions: a relQuery's answer and its offset
commit in one transaction (`commits`). Elsewhere at least once: a relQuery's offset is
committed only after its result is published (or the message is dead-lettered), and
only once every earlier offset of its partition is done, so a crash replays unfinished
work. Results are keyed by relQuery id; consumers de-duplicate on it.

- **Backlog and memory.** The engine is handed relQueries up to a budget of rows in
  flight (`backlog.RowBudget`), so its scheduler orders the real backlog; while one
  waits for room nothing more is decoded (its partition is sought back and paused), and
  fetches, decoding and dead letters are bounded (`backlog`, docs/operations.md "Bounded memory").
- **Bad input** (a message that does not decode) is dead-lettered with the reason; a
  relQuery whose serving raises is retried `max_attempts` times, then dead-lettered with
  the error (naming its rows' keys), so it never blocks its partition.
- **A broker outage loses nothing.** A result or dead letter the broker does not take is
  held, computed once, and re-published with backoff until it is acknowledged
  (`kafka.delivery.publish`); its offset is not committable before. Meanwhile its partition is
  paused (`pauses.Pauses`), so no new work piles up, and resumed when the broker is back.
- **An engine failure** (`EngineFailure`) is nobody's row error: the service publishes
  nothing more, commits nothing past the relQueries it was serving, and `run` raises, so
  the process exits non-zero and a restarted engine answers them.
- **Observability.** Each answered relQuery gets a `metrics` message (latency, rows by
  status, tokens); Prometheus gauges give the backlog and the consumer lag.
- **Rebalances.** On revocation the service commits what finished in those partitions,
  stops taking their work and forgets them; relQueries of theirs already being served
  are fenced (transactions) or may still publish (results are keyed by id).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass

from relstream.backend import EngineFailure, RelQueryBackend, RelQueryHandle, missing_members
from relstream.kafka.clients.aio import RevocationListener, new_consumer, new_producer
from relstream.kafka.delivery.letters import Part, dead_letter_of, letter_part, send_dead_letter
from relstream.kafka.delivery.outputs import open_outputs
from relstream.kafka.delivery.publish import Refused, publish_best_effort
from relstream.kafka.membership.static import rejoin, start_waiting, stop_leaving
from relstream.model import RelQuery, RelQueryResult, with_queued
from relstream.placement.reports import report_load
from relstream.ready import mark_ready_when
from relstream.service import backlog, offloop
from relstream.service.answercache import start_answer_topic
from relstream.service.backlog import LettersInFlight, RowBudget
from relstream.service.commits import AtLeastOnce, ExactlyOnce, Fenced, result_parts
from relstream.service.config import ServiceConfig
from relstream.service.control import Cancels, follow_control, record_time
from relstream.service.controlletters import ControlLetters
from relstream.service.looplag import LoopLagProbe
from relstream.service.metrics import EngineMetrics, consumer_lag
from relstream.service.offsets import OffsetBook
from relstream.service.pauses import Pauses
from relstream.service.retries import serve_with_retries
from relstream.wire import Message, MessageError, decode_relquery_stepwise
from relstream.wire.convert import partial_result_message
from relstream.wire.formats import Format, encode_as, headers_for, wire_format

log = logging.getLogger("relstream.engine")

LAG_EVERY_S = 1.0  # how often the consumer lag is measured for the metrics


@dataclass(frozen=True)
class _Work:
    """One decoded relQuery taken from Kafka."""

    partition: object  # the aiokafka TopicPartition it came from
    message: object  # the aiokafka ConsumerRecord
    relquery: RelQuery
    submitted_at: float  # seconds since the epoch, from the message
    result_format: Format  # its result's and partial results' encoding
    lease: int  # the assignment it was read under (`OffsetBook.start`): it commits only there

    keys = property(lambda self: [row.key for row in self.relquery.rows])  # its letter's


class KafkaService:
    """The engine process's Kafka side: reads the relqueries topic as a member of the
    engines' group, serves each relQuery on a backend (vLLM or the simulator), and
    publishes its result or dead letter with its offset."""

    def __init__(self, config: ServiceConfig, backend: RelQueryBackend) -> None:
        if missing := missing_members(backend):  # else its load reporter dies, not the engine
            raise TypeError(f"the backend lacks {', '.join(missing)} (relstream.backend)")
        self.config = config
        self.backend = backend
        self.metrics = EngineMetrics()
        budget = min(config.max_backlog_rows, backend.backlog_rows())
        self.budget: RowBudget[_Work] = RowBudget(budget, held_limit=config.max_held_rows)
        self._book = OffsetBook()
        self._tasks: set[asyncio.Task] = set()
        self._pauses = Pauses(self._apply_pauses)
        self._letters = LettersInFlight()  # dead letters of undecodable relQueries
        self._failure: EngineFailure | None = None
        self._lag_measured = 0.0  # monotonic time of the last lag measurement
        self._serving: dict[str, RelQueryHandle] = {}  # relQuery id -> its handle
        self._cancels = Cancels()  # asked on the control topic, scoped and expiring
        self.engine_name = f"{socket.gethostname()}:{os.getpid()}"
        self.loop_lag = LoopLagProbe(observe=self.metrics.loop_lag.observe)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; raises EngineFailure if the engine failed."""
        config = self.config
        self._producer = new_producer(config.bootstrap, config.security)
        self._consumer = new_consumer(
            config.bootstrap,
            broker_kind=config.broker,
            security=config.security,
            group_id=config.group_id,
            group_instance_id=config.instance_id,  # a restart takes its partitions back
        )
        outputs = await open_outputs(
            "engine", "results", bootstrap=config.bootstrap, group=config.group_id,
            security=config.security, producer=self._producer,
            transactions=config.transactions, stall_s=config.stall_s,
            on_fenced=lambda partition: rejoin(self._consumer, partition),  # the group decides
            co_partition=True,  # a dead engine's open transaction stalls its partitions only
            log=log,
        )  # fmt: skip
        exactly_once = outputs.exactly_once
        self._commits = (ExactlyOnce if exactly_once else AtLeastOnce)(outputs, self._book)
        self._control_letters = ControlLetters(config, self._producer, exactly_once)
        rebalances = RevocationListener(self._on_revoked, self._on_assigned)  # `joined`
        self._consumer.subscribe([self.config.topics.relqueries], listener=rebalances)
        if self.config.metrics_port:
            self.metrics.serve(self.config.metrics_port, self.config.metrics_host)
        if not await start_waiting(stop, log, config.bootstrap, self._producer, self._consumer):
            return  # stopped while it waited for its group
        await offloop.start_threads()
        answers = None
        if config.answer_topic:
            answers = await start_answer_topic(
                self.backend, self._producer, config.bootstrap, config.topics.answers,
                config.broker, config.security, config.answer_secret,
                self.metrics.answers_rejected,
            )  # fmt: skip
        log.info("engine (%s) serving %s as group %s", self.backend.policy,
                 config.topics.relqueries, config.group_id)  # fmt: skip
        control = follow_control(
            config.bootstrap, config.topics.control, self.cancel, self._dead_letter,
            config.broker, config.security,
        )  # fmt: skip
        load_now, engine = self.backend.load, self.engine_name
        report = report_load(load_now, self._consumer, self._producer, config, engine)
        tasks = [control, self.loop_lag.run(), report]  # report: its load, for placement
        followers = [asyncio.create_task(task) for task in tasks]  # each restarts if it dies
        if answers is not None:
            followers.append(asyncio.create_task(answers.follow()))
        try:
            self._spawn(mark_ready_when(rebalances.joined, config.ready_file, self.engine_name))
            while not stop.is_set() and self._failure is None:
                await self._poll_once()
                await self._commit()
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            if answers is not None:  # its last answers go out while the producer runs
                await answers.stop()
            await self._shut_down()
        if self._failure is not None:
            raise self._failure

    async def _shut_down(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        # A consumer's stop must not keep the process from stopping; uncommitted work is replayed.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                await self._commit()
                await stop_leaving(self._consumer)  # its partitions move at once
        await self._commits.stop()
        await self._producer.stop()

    # taking work
    async def _poll_once(self) -> None:
        self._start(self.budget.admit())
        self._apply_pauses()
        if self._letters.full:  # the broker is slow to take them
            await self._letters.wait(0.2)
            return
        batches = await self._consumer.getmany(timeout_ms=200, max_records=backlog.FETCH_RECORDS)
        for partition, messages in batches.items():
            if self._commits.settling(partition):  # sought once its previous owner is fenced
                continue
            for message in messages:
                if self.budget.full:
                    # Back-pressure: a decoded relQuery already waits for room, so the
                    # rest stays in Kafka, read again from here once the partition resumes.
                    self._consumer.seek(partition, message.offset)
                    break
                lease = self._book.start(partition, message.offset)
                if self._commits.replayed(partition, message):  # handed back: answered
                    self._book.finish(partition, message.offset, lease)
                    self.metrics.replays_skipped.inc()
                    continue
                work = await self._decode(partition, message, lease)
                if work is not None:  # handed over now if it fits: only what cannot waits
                    self.budget.offer(len(work.relquery.rows), work)
                    self._start(self.budget.admit())
        self._start(self.budget.admit())
        self._apply_pauses()
        self.metrics.observe_backlog(self.budget)
        if time.monotonic() - self._lag_measured > LAG_EVERY_S:
            self._lag_measured = time.monotonic()
            self.metrics.observe_lag(await consumer_lag(self._consumer))
            if (cache := getattr(self.backend, "answer_cache", None)) is not None:
                self.metrics.observe_answer_cache(cache)

    def _apply_pauses(self) -> None:
        self._pauses.apply(self._consumer, self.budget.full)

    async def _decode(self, partition, message, lease: int) -> _Work | None:
        """The message as work, or None once it is dead-lettered."""
        try:
            fmt = wire_format("relquery", message.value, message.headers)
            decoded = await decode_relquery_stepwise(message.value, json=fmt == "json")
            relquery = await offloop.relquery_of(decoded)
        except MessageError as exc:
            rejected = self._reject(partition, message, exc.reason, lease)
            self._letters.add(self._spawn(rejected), message)
            return None
        result_format = decoded.result_format or self.config.result_format
        return _Work(partition, message, relquery, decoded.submitted_at, result_format, lease)

    async def _reject(self, partition, message, reason: str, lease: int) -> None:
        """Dead-letter an undecodable relQuery; its offset is done once the letter is on
        the broker (or refused by it for good: `_dead_letter`)."""
        with self._pauses.holding(partition) as stalled:
            await self._dead_letter(message, reason, stalled, lease=lease)

    def _start(self, admitted: list[_Work]) -> None:
        for work in admitted:
            self._spawn(self._handle(work))

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # serving
    async def _handle(self, work: _Work) -> None:
        """Answer `work` and, once the broker has its result or dead letter, mark its
        offset done. While the broker does not take them, the partition is held."""
        try:
            with self._pauses.holding(work.partition) as stalled:
                await self._answer(work, stalled)
        except Fenced as exc:  # its partition moved: the new owner answers it
            log.info("left %s to its partition's new owner (%s)", work.relquery.id, exc)
        except EngineFailure as exc:
            log.error("engine failed serving %s: %s", work.relquery.id, exc)
            self._failure = self._failure or exc
        except Exception as exc:  # unforeseen: dead-lettered, never a partition held for good
            log.exception("could not finish %s", work.relquery.id)
            reason = f"the engine could not finish it: {exc!r}"
            await self._dead_letter(work.message, reason, keys=work.keys, lease=work.lease)
        finally:
            self.budget.release(len(work.relquery.rows))

    async def _answer(self, work: _Work, stalled) -> None:
        """Serve `work` once and publish its result until the broker has it: a publish
        failure never recomputes it. A relQuery that cannot be served, or whose result
        the broker refuses for good, is dead-lettered instead."""
        taken_at = time.time()
        result = await self._serve_with_retries(work)
        if isinstance(result, str):
            await self._dead_letter(work.message, result, stalled, work.keys, work.lease)
            return
        relquery = work.relquery
        # A result of any size reaches the user: in parts under the request limit.
        chunks = await offloop.result_parts(result, work.result_format)
        headers = headers_for(work.result_format)
        refused: list[Refused] = []
        lost: list[int] = []

        def instead(refusal: Refused) -> list[Part]:  # the whole result: its letter
            refused.append(refusal)
            reason = f"its result was refused: {refusal}"
            return [self._letter_part(work.message, reason, work.keys, lambda: lost.append(1))]

        parts = result_parts(self.config.topics.results, relquery.id, chunks, headers, instead)
        await self._commits.publish(work.partition, work.message, parts, stalled, work.lease)
        if refused:  # dead-lettered instead
            (self.metrics.dead_letter_failures if lost else self.metrics.dead_letters).inc()
            return
        metrics = await offloop.metrics_of(result, self.engine_name)
        await self._publish_best_effort(self.config.topics.metrics, relquery.id, metrics)
        await asyncio.to_thread(self.metrics.observe_result, result, time.time() - taken_at)
        total = f"{result.latency.total:.2f} s" if result.latency else "no row ran"
        rows = ", ".join(f"{n} {status}" for status, n in metrics.rows.items())
        log.info("answered %s: %d rows (%s), %s", relquery.id, len(result.rows), rows, total)

    async def _serve_with_retries(self, work: _Work) -> RelQueryResult | str:
        """The relQuery's result, or the reason to dead-letter it (`retries`)."""
        config = self.config
        return await serve_with_retries(
            lambda: self._serve(work), work.relquery.id, config.max_attempts,
            config.retry_backoff_s,
        )  # fmt: skip

    async def _serve(self, work: _Work) -> RelQueryResult:
        relquery = work.relquery
        taken_at = time.time()
        since = max(work.submitted_at, record_time(work.message))  # a replay: its record's
        if self._cancels.covers(relquery.id, since):  # cancelled while it waited in Kafka
            answered = await offloop.cancelled(
                relquery, self.backend.policy, self.backend.model_name
            )
        else:
            with self._cancels.serving(relquery.id, since):
                answered = await self._run(relquery, work.result_format)
        return with_queued(answered, max(taken_at - work.submitted_at, 0.0), relquery)

    async def _run(self, relquery: RelQuery, fmt: Format) -> RelQueryResult:
        handle = await self.backend.submit(relquery)
        self._serving[relquery.id] = handle
        try:
            if self.config.partial_results:
                async for row in handle.rows():
                    partial = partial_result_message(relquery.id, row)
                    topic = self.config.topics.partial_results
                    await self._publish_best_effort(topic, relquery.id, partial, fmt)
            return await handle.result()
        finally:
            self._serving.pop(relquery.id, None)

    async def cancel(self, relquery_id: str, at: float | None = None) -> None:
        """Cancel a relQuery submitted before `at` (None: now) that this engine serves,
        or remember it for when it is taken (`control.Cancels`: scoped, expiring)."""
        self._cancels.add(relquery_id, time.time() if at is None else at)
        handle = self._serving.get(relquery_id)
        if handle is not None and self._cancels.covers(relquery_id):
            log.info("cancelling %s", relquery_id)
            await handle.cancel()

    async def _dead_letter(
        self, message, reason: str, stalled=lambda: None, keys=None, lease: int = 0
    ) -> None:
        """Dead-letter `message`; returns once the broker has the letter (or refused it
        for good: logged and counted). A relQuery's letter finishes its offset (in one
        transaction, if any) under the `lease` it was read under, even if the broker
        refuses the letter."""
        log.warning(
            "dead-letter %s[%s]@%s: %s", message.topic, message.partition, message.offset, reason
        )
        topic = self.config.topics.deadletter
        if message.topic == self.config.topics.relqueries:
            delivered = await self._commits.dead_letter(
                message, topic, reason, stalled, keys, lease
            )
        elif message.topic == self.config.topics.control:  # once, whoever reads it
            delivered = await self._control_letters.letter(message, topic, reason, stalled)
        else:
            delivered = await send_dead_letter(self._producer, topic, message, reason, stalled)
        if delivered:
            self.metrics.dead_letters.inc()
        elif delivered is not None:  # None: its partition moved, the new owner letters it
            self.metrics.dead_letter_failures.inc()

    def _letter_part(self, message, reason: str, keys: list[str], on_lost) -> Part:
        """The dead letter of a relQuery whose result the broker refused for good, in its
        result's stead."""
        letter, what = dead_letter_of(message, reason, keys)
        log.warning("%s: %s", what.replace("the dead letter of", "dead-letter"), reason)
        return letter_part(self.config.topics.deadletter, letter, what, on_lost)

    async def _publish_best_effort(
        self, topic: str, key: str, payload: Message, fmt: Format = "msgpack"
    ) -> None:
        """Partial results and metrics: nothing waits on them (the result carries every
        row), so one the broker does not take is logged, not retried."""
        value, headers = encode_as(payload, fmt), headers_for(fmt)
        await publish_best_effort(self._producer, topic, value, key.encode(), headers)

    # offsets
    async def _commit(self) -> None:
        await self._commits.commit(self._consumer)

    async def _on_assigned(self, assigned) -> None:
        await self._commits.assigned(self._consumer, assigned)

    async def _on_revoked(self, revoked) -> None:
        await self._commits.revoked(self._consumer, revoked)
        self._book.forget(revoked)
        dropped = self.budget.drop_waiting(lambda work: work.partition not in revoked)
        if revoked:
            self.metrics.partitions_revoked.inc(len(revoked))
            log.info("partitions revoked: %s (%d waiting relQueries left)", revoked, dropped)
        self._pauses.revoked()
