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
read up to MAX_BODY_BYTES, within BODY_SECONDS.
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
from relstream.schemas import MessageError, RelQueryMessage, decode_json
from relstream.schemas.codec import MAX_MESSAGE_BYTES
from relstream.schemas.convert import partial_result_message, result_message
from relstream.service.forward import DoorPlacement, NotAnswered
from relstream.service.offloop import relquery_of

MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # the same bound as a message on the relqueries topic
BODY_SECONDS = 30.0  # the longest a client may take to send its body


class HttpError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def build_http_app(
    backend: RelQueryBackend,
    cancel_elsewhere: Callable[[str], Awaitable[None]] | None = None,
    body_seconds: float = BODY_SECONDS,
    registry: CollectorRegistry | None = None,
    placement: DoorPlacement | None = None,
) -> FastAPI:
    """The door over `backend`. `cancel_elsewhere(id)` also reaches relQueries that came by
    Kafka (the engine service's cancel). A body not received within `body_seconds` is a
    408: a client that trickles its bytes holds no connection for long. `registry` (the
    engine service's, when it serves Kafka too) gets the door's counter and is what
    /metrics shows. `placement` sends a relQuery to a less loaded engine where it says
    so."""
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
        return JSONResponse({"error": error.reason}, status_code=error.status)

    @app.post(
        "/v1/relqueries",
        summary="Answer a relQuery: one LLM request per row",
        openapi_extra={"requestBody": _request_body()},
    )
    async def submit(request: Request, stream: bool = False) -> Response:
        try:
            async with asyncio.timeout(body_seconds):
                message = await _read_message(request)
        except TimeoutError:
            raise HttpError(408, f"the body did not arrive within {body_seconds:g} s") from None
        relquery = await relquery_of(message)  # rows and free field layout, off the loop
        if relquery.id in serving or (placement and placement.forwarded(relquery.id)):
            raise HttpError(409, f"relQuery {relquery.id!r} is already being served")
        if placement is not None and not stream:  # streamed rows come only from here
            try:
                forwarded = await placement.answer(message)
            except NotAnswered as exc:
                answered.labels("forward failed").inc()
                raise HttpError(exc.status, exc.reason) from None
            if forwarded is not None:
                answered.labels("forwarded").inc()
                return Response(forwarded, media_type="application/json")
        handle = await backend.submit(relquery)
        serving[relquery.id] = handle
        if stream:
            return StreamingResponse(
                _events(handle, relquery, serving), media_type="text/event-stream"
            )
        try:
            result = with_deadline(await handle.result(), relquery.deadline_s)
        except EngineFailure as exc:
            failed.append(str(exc))
            answered.labels("engine failed").inc()
            raise HttpError(503, f"the engine failed: {exc}") from None
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


async def _read_message(request: Request) -> RelQueryMessage:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise HttpError(413, f"body is {declared} bytes; the limit is {MAX_BODY_BYTES}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            raise HttpError(413, f"body is over the limit of {MAX_BODY_BYTES} bytes")
    return await asyncio.to_thread(decode_json, RelQueryMessage, bytes(body))


async def _result_json(result: RelQueryResult) -> bytes:
    """The result message as JSON, built off the event loop (it may hold 100,000 rows)."""
    return await asyncio.to_thread(lambda: msgspec.json.encode(result_message(result)))


async def _events(
    handle: RelQueryHandle, relquery: RelQuery, serving: dict
) -> AsyncIterator[bytes]:
    """A `row` event as each row finishes, then the `result` (or an `error`)."""
    try:
        async for row in handle.rows():
            partial = partial_result_message(relquery.id, row)
            yield _event("row", msgspec.json.encode(partial))
        result = with_deadline(await handle.result(), relquery.deadline_s)
        yield _event("result", await _result_json(result))
    except EngineFailure as exc:
        yield _event("error", json.dumps({"error": f"the engine failed: {exc}"}).encode())
    finally:
        serving.pop(relquery.id, None)


def _event(name: str, data: bytes) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + data + b"\n\n"


def _request_body() -> dict:
    """The relquery message's published JSON Schema, so /docs shows what to send."""
    text = resources.files("relstream.schemas").joinpath("json/relquery.schema.json").read_text()
    return {"required": True, "content": {"application/json": {"schema": json.loads(text)}}}
