"""The HTTP door over the simulated backend: answers, streamed rows, cancel, and 4xx
naming what is wrong (never a 500)."""

import asyncio
import json
import time

import httpx
import pytest

from relstream.service.http import MAX_BODY_BYTES, build_http_app
from relstream.sim.backend import SimRelQueryBackend, SimSettings


def body(relquery_id: str = "q1", **fields) -> dict:
    return {
        "version": 1,
        "id": relquery_id,
        "template": "Describe {city}.",
        "rows": [{"key": f"r{i}", "values": {"city": c}} for i, c in enumerate(["Oslo", "Rome"])],
        "max_output_tokens": 8,
        "submitted_at": time.time(),
        **fields,
    }


def call(time_scale: float, scenario, **door):
    app = build_http_app(SimRelQueryBackend(SimSettings(time_scale=time_scale)), **door)

    async def run():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://door") as client:
            return await scenario(client)

    return asyncio.run(run())


def test_a_relquery_is_answered_row_by_row():
    response = call(0.0, lambda client: client.post("/v1/relqueries", json=body()))
    assert response.status_code == 200
    result = response.json()
    assert [(row["key"], row["output"]) for row in result["rows"]] == [
        ("r0", "Describe Oslo."),
        ("r1", "Describe Rome."),
    ]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({**body(), "rows": [{"values": {"city": "Oslo"}}]}, "field rows[0].key"),
        ({**body(), "temperature": 5}, "field temperature"),
        ({**body(), "output": {"regex": "(open"}}, "field output.regex"),
        ({**body(), "template": "Describe {city.name}"}, "field template"),
    ],
)
def test_bad_requests_are_400s_naming_the_field(payload, reason):
    response = call(0.0, lambda client: client.post("/v1/relqueries", json=payload))
    assert response.status_code == 400
    assert reason in response.json()["error"]


def test_a_body_over_the_limit_is_a_413():
    huge = b"x" * (MAX_BODY_BYTES + 1)
    response = call(0.0, lambda client: client.post("/v1/relqueries", content=huge))
    assert response.status_code == 413


def test_streamed_rows_come_as_events_before_the_result():
    async def scenario(client):
        response = await client.post("/v1/relqueries?stream=true", json=body())
        return response.text

    events = [
        (block.split("\n")[0].removeprefix("event: "), json.loads(block.split("data: ", 1)[1]))
        for block in call(0.0, scenario).strip().split("\n\n")
    ]
    assert [name for name, _ in events] == ["row", "row", "result"]
    assert {data["key"] for name, data in events if name == "row"} == {"r0", "r1"}


def test_delete_cancels_a_running_relquery_and_its_result_says_so():
    async def scenario(client):
        answer = asyncio.create_task(client.post("/v1/relqueries", json=body("slow")))
        await asyncio.sleep(0.5)  # the simulated answer takes seconds at 50x real time
        cancel = await client.delete("/v1/relqueries/slow")
        missing = await client.delete("/v1/relqueries/nobody")
        return (await answer).json(), cancel.status_code, missing.status_code

    result, cancelled, missing = call(50.0, scenario)
    assert (cancelled, missing) == (202, 404)
    assert [row["status"] for row in result["rows"]] == ["cancelled", "cancelled"]


def test_a_body_that_trickles_in_is_a_408_and_holds_nothing():
    async def trickle():
        yield b'{"version": 1, '
        await asyncio.sleep(5)  # a slow (or hostile) client
        yield b'"id": "q1"}'

    async def scenario(client):
        started = time.monotonic()
        response = await client.post("/v1/relqueries", content=trickle())
        return response, time.monotonic() - started

    response, took = call(0.0, scenario, body_seconds=0.5)
    assert response.status_code == 408 and took < 3
    assert response.json() == {"error": "the body did not arrive within 0.5 s"}


def test_health_metrics_and_models_answer_as_operators_expect():
    async def scenario(client):
        health = await client.get("/health")
        await client.post("/v1/relqueries", json=body())
        metrics = await client.get("/metrics")
        models = await client.get("/v1/models")
        return health, metrics, models

    health, metrics, models = call(0.0, scenario)
    assert health.status_code == 200 and health.json() == {"status": "ok", "serving": 0}
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'relstream_http_relqueries_total{outcome="answered"} 1.0' in metrics.text
    assert models.json() == {
        "object": "list",
        "data": [{"id": "sim", "object": "model", "owned_by": "relstream"}],
    }
