"""The real engine: vLLM's CPU build serving SmolLM2-135M under relstream's policies.

Slow (one engine start per policy, ~30-50 s each) and kept small, but it is the proof
that the plug-in drives vLLM: outputs must not depend on the policy, each answer must
belong to its row, and bad rows must fail alone while the engine keeps serving.
"""

import asyncio

import pytest

from relstream.backend import run
from relstream.engine.runtime import EngineSettings, RelQueryEngine
from relstream.model import RelQuery, Row, Template

pytestmark = pytest.mark.slow

CAPITALS = {
    "France": "Paris",
    "Germany": "Berlin",
    "Italy": "Rome",
    "Japan": "Tokyo",
    "Spain": "Madrid",
}
POLICIES = ("v1-fcfs", "v1-priority", "relserve")


def capitals_relquery() -> RelQuery:
    rows = [Row(country, {"country": country}) for country in CAPITALS]
    template = Template("What is the capital of {country}? Answer with the city name only.")
    return RelQuery("capitals", template, rows, max_output_tokens=8)


def descriptions_relquery() -> RelQuery:
    rows = [
        Row(str(i), {"thing": t}) for i, t in enumerate(["the sea", "a forest", "snow", "bread"])
    ]
    template = Template("Describe {thing} in one short sentence.")
    return RelQuery("describe", template, rows, max_output_tokens=24)


def faulty_relquery() -> RelQuery:
    rows = [
        Row("ok", {"country": "France"}),
        Row("empty", {"country": "  "}),
        Row("no-column", {"nation": "Spain"}),
        Row("too-long", {"country": "word " * 3000}),
    ]
    template = Template("What is the capital of {country}? Answer with the city name only.")
    return RelQuery("faulty", template, rows, max_output_tokens=8)


async def serve(policy: str) -> dict:
    engine = await RelQueryEngine.start(EngineSettings(policy=policy))
    try:
        handles = [await engine.submit(rq) for rq in (capitals_relquery(), descriptions_relquery())]
        results = {h.relquery_id: await h.result() for h in handles}
        if policy == "relserve":
            results["faulty"] = await run(engine, faulty_relquery())
            results["after"] = await run(engine, capitals_relquery())  # still serving
        return results
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def served() -> dict[str, dict]:
    return {policy: asyncio.run(serve(policy)) for policy in POLICIES}


def test_every_answer_belongs_to_its_row(served):
    for policy, results in served.items():
        result = results["capitals"]
        assert [row.row_key for row in result.rows] == list(CAPITALS)
        for row in result.rows:
            assert row.status == "ok", (policy, row)
            assert CAPITALS[row.row_key] in row.output, (policy, row)


def test_greedy_outputs_are_byte_identical_across_policies(served):
    reference = served["v1-fcfs"]
    for policy in POLICIES[1:]:
        for relquery_id in ("capitals", "describe"):
            assert served[policy][relquery_id].outputs == reference[relquery_id].outputs, policy


def test_latency_breakdown_comes_from_the_engine(served):
    for results in served.values():
        for relquery_id in ("capitals", "describe"):
            latency = results[relquery_id].latency
            assert latency is not None and latency.total > 0
            assert min(latency.waiting, latency.core, latency.tail) >= 0


def test_bad_rows_fail_alone_and_the_engine_keeps_serving(served):
    faulty = {row.row_key: row for row in served["relserve"]["faulty"].rows}
    assert faulty["ok"].status == "ok" and "Paris" in faulty["ok"].output
    assert faulty["empty"].status == "error" and "empty" in faulty["empty"].error
    assert faulty["no-column"].status == "error" and "{country}" in faulty["no-column"].error
    assert faulty["too-long"].status == "error" and "tokens" in faulty["too-long"].error
    assert served["relserve"]["after"].outputs == served["relserve"]["capitals"].outputs
