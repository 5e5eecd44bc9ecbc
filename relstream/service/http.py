"""The HTTP door (`relstream serve`): relQueries for spreadsheet and SQL clients, served
by the same engine, and so the same scheduler, as the Kafka consumer beside it.

    POST   /v1/relqueries              the relquery message as JSON → its result
    POST   /v1/relqueries?stream=true  server-sent events: a `row` event per finished row,
                                       then the `result`
    DELETE /v1/relqueries/{id}         cancel: the result comes back with the unfinished
                                       rows "cancelled"
    GET    /health                     200 while the engine serves, 503 once it failed
    GET    /metrics                    Prometheus: the door's requests by outcome, and the
                                       engine service's metrics when it serves Kafka too
    GET    /v1/models                  the model it serves, as OpenAI's API lists models
    GET    /docs                       OpenAPI documentation

With `placement` (the engine serves Kafka and reports its load; `service/forward.py`), a
relQuery not streamed may be answered by the engine with the least outstanding work,
through Kafka: its result is the same JSON; a 502 if it was dead-lettered there, a 504 if
no result came within its deadline.

A bad request is a 4xx naming the field (400), the size (413), the id (404, 409) or
the time its body took (408); an engine failure is a 503, never a row error. Bodies are
read up to MAX_BODY_BYTES, within BODY_SECONDS. What the door holds at once is bounded
(`service/doorlimits.py`): past it, a 429 with `Retry-After`. A client that disconnects
before its answer cancels its relQuery, here or where it was forwarded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from relstream.backend import EngineFailure, RelQueryBackend, RelQueryHandle
from relstream.model import RelQuery, RelQueryResult, with_deadline
from relstream.service.doorlimits import DoorAdmission, DoorLimits, HttpError, Ticket
from relstream.service.forward import DoorPlacement, NotAnswered
from relstream.service.offloop import relquery_of
from relstream.wire import MessageError, RelQueryMessage, decode_json
from relstream.wire.codec import MAX_MESSAGE_BYTES
from relstream.wire.convert import partial_result_message, result_message

MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # the same bound as a message on the relqueries topic
BODY_SECONDS = 30.0  # the longest a client may take to send its body
GONE = 499  # the status logged for a client that went away before its answer (as nginx)


def build_http_app(
    backend: RelQueryBackend,
    cancel_elsewhere: Callable[[str], Awaitable[None]] | None = None,
    body_seconds: float = BODY_SECONDS,
    registry: CollectorRegistry | None = None,
    placement: DoorPlacement | None = None,
    limits: DoorLimits | None = None,
) -> FastAPI:
    """The door over `backend`. `cancel_elsewhere(id)` also reaches relQueries that came by
    Kafka (the engine service's cancel). A body not received within `body_seconds` is a
    408: a client that trickles its bytes holds no connection for long. `registry` (the
    engine service's, when it serves Kafka too) gets the door's counter and is what
    /metrics shows. `placement` sends a relQuery to a less loaded engine where it says
    so. `limits` bound what the door holds at once."""
    app = FastAPI(title="relstream", summary="LLM answers over table rows", version="1")
    serving: dict[str, RelQueryHandle] = {}
    registry = registry or CollectorRegistry()
    answered = Counter(
        "relstream_http_relqueries",
        "relQueries the HTTP door answered, by outcome",
        ["outcome"],
        registry=registry,
    )
    failed: list[str] = []  # the engine's failure, once it failed
    admission = DoorAdmission(limits or DoorLimits())

    @app.get("/health", summary="200 while the engine serves, 503 once it failed")
    async def health() -> JSONResponse:
        if failed:
            return JSONResponse({"status": "failed", "error": failed[0]}, status_code=503)
        return JSONResponse({"status": "ok", "serving": len(serving)})

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", summary="The model this engine serves")
    async def models() -> JSONResponse:
        model = {"id": backend.model_name, "object": "model", "owned_by": "relstream"}
        return JSONResponse({"object": "list", "data": [model]})

    @app.exception_handler(HttpError)
    async def refuse(_request: Request, error: HttpError) -> JSONResponse:
        if error.retry_after is None:
            return JSONResponse({"error": error.reason}, status_code=error.status)
        answered.labels("busy").inc()
        headers = {"Retry-After": str(error.retry_after)}
        return JSONResponse({"error": error.reason}, status_code=error.status, headers=headers)

    @app.post(
        "/v1/relqueries",
        summary="Answer a relQuery: one LLM request per row",
        openapi_extra={"requestBody": _request_body()},
    )
    async def submit(request: Request, stream: bool = False) -> Response:
        ticket = admission.enter()  # a 429 before the body is read, once the door is full
        streaming = False  # the ticket is then the stream's to give back
        try:
            try:
                async with asyncio.timeout(body_seconds):
                    message = await _read_message(request, ticket)
            except TimeoutError:
                reason = f"the body did not arrive within {body_seconds:g} s"
                raise HttpError(408, reason) from None
            ticket.hold_rows(len(message.rows))
            ticket.claim(message.id)  # at once: no other request can take it meanwhile
            relquery = await relquery_of(message)  # rows and free field layout, off the loop
            if placement is not None and not stream:  # streamed rows come only from here
                forwarded = await forward(request, message)
                if forwarded is not None:
                    return forwarded
            handle = await backend.submit(relquery)
            serving[relquery.id] = handle
            if stream:
                streaming = True
                return _Streamed(request, handle, relquery, answered, serving, ticket).response
            return await answer_here(request, handle, relquery)
        finally:
            if not streaming:
                ticket.release()

    async def forward(request: Request, message: RelQueryMessage) -> Response | None:
        """Its answer from where placement sends it; None to serve it here."""
        try:
            forwarded = await _unless_gone(request, placement.answer(message), _cancelled)
        except NotAnswered as exc:
            answered.labels("forward failed").inc()
            raise HttpError(exc.status, exc.reason) from None
        except _Gone:  # the placement asked the engine to cancel it
            answered.labels("disconnected").inc()
            return Response(status_code=GONE)
        if forwarded is None:
            return None
        answered.labels("forwarded").inc()
        return Response(forwarded, media_type="application/json")

    async def answer_here(request: Request, handle: RelQueryHandle, relquery: RelQuery):
        async def stop(result: asyncio.Task) -> None:
            await handle.cancel()
            await asyncio.gather(result, return_exceptions=True)

        try:
            result = with_deadline(
                await _unless_gone(request, handle.result(), stop), relquery.deadline_s
            )
        except EngineFailure as exc:
            failed.append(str(exc))
            answered.labels("engine failed").inc()
            raise HttpError(503, f"the engine failed: {exc}") from None
        except _Gone:
            answered.labels("disconnected").inc()
            return Response(status_code=GONE)
        finally:
            serving.pop(relquery.id, None)
        answered.labels("answered").inc()
        return Response(await _result_json(result), media_type="application/json")

    @app.delete("/v1/relqueries/{relquery_id}", summary="Cancel a relQuery")
    async def cancel(relquery_id: str) -> JSONResponse:
        handle = serving.get(relquery_id)
        if handle is not None:
            await handle.cancel()
        elif placement is not None and placement.forwarded(relquery_id):
            await placement.cancel(relquery_id)  # where it was sent
        elif cancel_elsewhere is not None:
            await cancel_elsewhere(relquery_id)
        else:
            raise HttpError(404, f"no relQuery {relquery_id!r} is being served")
        return JSONResponse({"cancelled": relquery_id}, status_code=202)

    @app.exception_handler(MessageError)
    async def bad_message(_request: Request, error: MessageError) -> JSONResponse:
        return JSONResponse({"error": error.reason}, status_code=400)

    return app


async def _read_message(request: Request, ticket: Ticket) -> RelQueryMessage:
    """The body, its bytes held by `ticket` as they arrive (all it declares, at once)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > MAX_BODY_BYTES:
            raise HttpError(413, f"body is {declared} bytes; the limit is {MAX_BODY_BYTES}")
        ticket.hold_bytes(int(declared))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise HttpError(413, f"body is over the limit of {MAX_BODY_BYTES} bytes")
        ticket.hold_bytes(len(body))
    return await asyncio.to_thread(decode_json, RelQueryMessage, bytes(body))


class _Gone(Exception):
    """The client disconnected before its answer."""


async def _disconnected(request: Request) -> None:
    """Returns once the client has gone, or (the server says so too) once it was answered:
    called after the body was read, so no other message can come."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work, stop):
    """What `work` (a coroutine) returns, unless its client disconnects first: then
    `stop(task)` (the task running it) and _Gone."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # the server stops this request
        task.cancel()
        raise
    finally:
        gone.cancel()
    if not task.done():
        await stop(task)
        raise _Gone
    return task.result()


async def _cancelled(task: asyncio.Task) -> None:
    """A forwarded relQuery's wait cancelled: the placement cancels it where it went."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _result_json(result: RelQueryResult) -> bytes:
    """The result message as JSON, built off the event loop (it may hold 100,000 rows)."""
    return await asyncio.to_thread(lambda: msgspec.json.encode(result_message(result)))


class _Streamed:
    """A streamed relQuery: its events, and its client watched meanwhile. A client that
    leaves mid-stream cancels it; the request's place (`ticket`) is given back when the
    last event is sent or the client has gone, whichever is first. (The server stops
    iterating the events of a client that has gone, or never starts them: the watch,
    not the events, is sure to see the end.)"""

    def __init__(self, request: Request, handle: RelQueryHandle, relquery: RelQuery,
                 answered: Counter, serving: dict, ticket: Ticket) -> None:  # fmt: skip
        self._handle, self._relquery, self._answered = handle, relquery, answered
        self._serving, self._ticket = serving, ticket
        self._finished = False
        self._watch = asyncio.create_task(self._watch_client(request))
        self.response = StreamingResponse(self._events(), media_type="text/event-stream")

    def _release(self) -> None:
        self._serving.pop(self._relquery.id, None)
        self._ticket.release()

    async def _watch_client(self, request: Request) -> None:
        try:
            await _disconnected(request)
            if not self._finished:
                self._answered.labels("disconnected").inc()
                await self._handle.cancel()
        finally:
            self._release()

    async def _events(self) -> AsyncIterator[bytes]:
        """A `row` event as each row finishes, then the `result` (or an `error`)."""
        handle, relquery = self._handle, self._relquery
        try:
            try:
                async for row in handle.rows():
                    partial = partial_result_message(relquery.id, row)
                    yield _event("row", msgspec.json.encode(partial))
                result = with_deadline(await handle.result(), relquery.deadline_s)
                yield _event("result", await _result_json(result))
                outcome = "answered"  # as one not streamed: /metrics counts both
            except EngineFailure as exc:
                error = json.dumps({"error": f"the engine failed: {exc}"}).encode()
                yield _event("error", error)
                outcome = "engine failed"
            self._answered.labels(outcome).inc()
            self._finished = True
        finally:
            if self._finished:  # else the watch cancels it (this may be its cancellation)
                self._watch.cancel()
                self._release()


def _event(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def _request_body() -> dict:
    """The relquery message's published JSON Schema, so /docs shows what to send."""
    text = resources.files("relstream.wire").joinpath("json/relquery.schema.json").read_text()
    return {"required": True, "content": {"application/json": {"schema": json.loads(text)}}}
