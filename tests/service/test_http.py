"""The HTTP door over the simulated backend: answers, streamed rows, cancel, 4xx naming
what is wrong (never a 500), its bounds (429), and a client that goes away."""

import asyncio
import json
import time

import httpx
import pytest
from helpers import door_serving, http_server, post_and_leave

from relstream.service.doorlimits import DoorLimits
from relstream.service.http import MAX_BODY_BYTES, build_http_app
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.stream.windowing import Window


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


def test_metrics_count_streamed_relqueries_with_the_others():
    async def scenario(client):
        await client.post("/v1/relqueries?stream=true", json=body("q1"))
        await client.post("/v1/relqueries", json=body("q2"))
        return (await client.get("/metrics")).text

    assert 'relstream_http_relqueries_total{outcome="answered"} 2.0' in call(0.0, scenario)


def test_delete_cancels_a_running_relquery_and_its_result_says_so():
    async def scenario(client):
        answer = asyncio.create_task(client.post("/v1/relqueries", json=body("slow")))
        await door_serving(client)  # being answered: that takes seconds at 50x real time
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


SLOW = 50.0  # the simulator at 50x real time: a relQuery of body() takes about 12 s


@pytest.mark.slow
def test_past_its_bound_of_relqueries_a_request_is_a_429_with_retry_after():
    async def scenario(client):
        held = [
            asyncio.create_task(client.post("/v1/relqueries", json=body(f"h{i}"))) for i in (0, 1)
        ]
        await door_serving(client, 2)  # both held, being answered
        refused = await client.post("/v1/relqueries", json=body("third"))
        for relquery_id in ("h0", "h1"):
            await client.delete(f"/v1/relqueries/{relquery_id}")
        await asyncio.gather(*held)
        later = await client.post("/v1/relqueries", json=body("third"))
        metrics = await client.get("/metrics")
        return refused, later, metrics.text

    refused, later, metrics = call(SLOW, scenario, limits=DoorLimits(relqueries=2))
    assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
    assert refused.json() == {"error": "the door holds 2 relQueries, its most; try again later"}
    assert later.status_code == 200  # their places given back
    assert 'relstream_http_relqueries_total{outcome="busy"} 1.0' in metrics


def test_past_its_bound_of_rows_or_bytes_a_request_is_a_429_and_one_over_it_alone_a_413():
    # Every body below is about this size (as httpx sends JSON).
    size = len(json.dumps(body("a"), separators=(",", ":")).encode())

    async def scenario(client):
        held = asyncio.create_task(client.post("/v1/relqueries", json=body("a")))
        await door_serving(client)
        rows = await client.post("/v1/relqueries", json=body("b"))  # 2 + 2 rows
        await client.delete("/v1/relqueries/a")
        await held
        many = body("c", rows=[{"key": f"k{i}", "values": {"city": "Oslo"}} for i in range(4)])
        return rows, await client.post("/v1/relqueries", json=many)

    busy, alone = call(SLOW, scenario, limits=DoorLimits(rows=3))
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"] == "the door holds 2 rows, its most; try again later"
    assert (alone.status_code, alone.json()) == (413, {"error": "4 rows; the door holds at most 3"})

    async def by_bytes(client):
        held = asyncio.create_task(client.post("/v1/relqueries", json=body("a")))
        await door_serving(client)
        busy = await client.post("/v1/relqueries", json=body("b"))
        await client.delete("/v1/relqueries/a")
        await held
        big = await client.post("/v1/relqueries", json=body("c", system_prompt="x" * size))
        return busy, big

    busy, big = call(SLOW, by_bytes, limits=DoorLimits(body_bytes=size * 3 // 2))
    assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
    assert busy.json()["error"].endswith("bytes of bodies, its most; try again later")
    assert big.status_code == 413, big.text


def test_an_id_in_the_workers_window_form_is_refused_and_others_are_not():
    window = Window(partition=0, first_offset=12, deadline=0.0, rows=[], last_offset=12,
                    first_ms=1763800000000)  # fmt: skip
    workers = str(window.window_id("reviews"))  # as the worker names a window's relQuery

    async def scenario(client):
        ids = (workers, "reviews-0-12", "fill-1", "a@b")
        return [await client.post("/v1/relqueries", json=body(i)) for i in ids]

    refused, *taken = call(0.0, scenario)
    assert refused.status_code == 400
    assert refused.json()["error"].startswith(
        "field id: 'reviews-0-12@1763800000000' has the form of a worker's window id"
    )
    assert [response.status_code for response in taken] == [200, 200, 200]


class KeptHandles(SimRelQueryBackend):
    """The simulated backend, keeping the handle of each relQuery it was given."""

    def __init__(self, settings: SimSettings) -> None:
        super().__init__(settings)
        self.handles = []

    async def submit(self, relquery):
        handle = await super().submit(relquery)
        self.handles.append(handle)
        return handle


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_cancels_its_relquery(stream):
    backend = KeptHandles(SimSettings(time_scale=SLOW))
    app = build_http_app(backend)

    async def scenario():
        async with http_server(app) as port:
            await post_and_leave(port, body("gone"), door_serving(port), stream=stream)
            left = time.monotonic()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                async with asyncio.timeout(30):
                    while (await client.get("/health")).json()["serving"]:
                        await asyncio.sleep(0.05)
                took = time.monotonic() - left
                metrics = (await client.get("/metrics")).text
            async with asyncio.timeout(5):
                result = await backend.handles[0].result()
            return took, backend.load().outstanding_s, result, metrics

    took, outstanding, result, metrics = asyncio.run(scenario())
    # Cancelled at once (its answer takes about 12 s): the engine has nothing left to do.
    assert took < 3 and outstanding == 0.0, (took, outstanding)
    assert [row.status for row in result.rows] == ["cancelled", "cancelled"]
    assert 'relstream_http_relqueries_total{outcome="disconnected"} 1.0' in metrics


def test_a_client_that_goes_away_gives_back_its_place():
    backend = SimRelQueryBackend(SimSettings(time_scale=SLOW))
    app = build_http_app(backend, limits=DoorLimits(relqueries=1))

    async def scenario():
        async with http_server(app) as port:
            await post_and_leave(port, body("gone"), door_serving(port))
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                async with asyncio.timeout(3):  # its answer would take about 12 s
                    while True:  # an empty relQuery: a 400 once it is read, until then a 429
                        response = await client.post("/v1/relqueries", json=body(rows=[]))
                        if response.status_code != 429:
                            return response.status_code
                        await asyncio.sleep(0.05)

    assert asyncio.run(scenario()) == 400
