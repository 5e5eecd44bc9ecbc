"""The placer's book of load reports, on hand-computed cases; the sim backend's load."""

import asyncio

import pytest

from relstream.backend import template_id
from relstream.engine.tokenizer import load_tokenizer
from relstream.model import RelQuery, Row, Template
from relstream.placer import LoadBook, placement_of, prompt_tokens
from relstream.schemas import LoadReportMessage, RelQueryMessage, RelQueryRow, encode
from relstream.service.loadreport import HEADERS
from relstream.sim.backend import SimRelQueryBackend, SimSettings

TOPIC = "relstream.relqueries"
NOW = 1000.0


def report(engine, partitions, outstanding, at=NOW, per_output=0.01, templates=(), topic=TOPIC):
    message = LoadReportMessage(
        engine=engine,
        topic=topic,
        partitions=list(partitions),
        outstanding_s=outstanding,
        per_output_token_s=per_output,
        templates=list(templates),
        at=at,
    )
    return encode(message)


def relquery(id="q", rows=2, tokens=10, template="Say {x}."):
    rows = [RelQueryRow(key=f"k{i}", values={"x": "abcd"}) for i in range(rows)]
    return RelQueryMessage(
        id=id, template=template, rows=rows, max_output_tokens=tokens, submitted_at=NOW
    )


@pytest.fixture
def book():
    return LoadBook(TOPIC, clock=lambda: NOW)


def test_no_fresh_report_leaves_the_hash(book):
    assert book.partition_for(relquery()) is None
    assert book.take(report("a", [0], 0.0, at=NOW - 3.5), HEADERS)  # older than 3 s
    assert book.partition_for(relquery()) is None
    assert book.take(report("a", [], 0.0), HEADERS)  # owns no partition (yet)
    assert book.partition_for(relquery()) is None


def test_only_load_reports_of_its_topic_count(book):
    assert not book.take(report("a", [0], 0.0), None)  # no header: a metrics message
    assert not book.take(report("a", [0], 0.0, topic="other.relqueries"), HEADERS)
    assert not book.take(b"\x81\xa1x\x01", HEADERS)  # not a load report: logged, ignored
    assert book.engines() == []


def test_the_least_loaded_engine_takes_it_counting_what_was_sent_since(book):
    # Each relQuery: 2 rows x 10 tokens = 20 output tokens at 0.01 s = 0.2 s (prompts free).
    book.take(report("a", [0, 1], 1.0), HEADERS)
    book.take(report("b", [2, 3], 0.5), HEADERS)
    # b: 0.5 -> 0.7 -> 0.9; then a (1.0) and b (0.9) are tied within 10 %: b, the least.
    assert [book.partition_for(relquery(f"q{i}")) for i in range(3)] == [2, 3, 2]
    # b at 1.1 is within 10 % of a at 1.0 (or just over it): a, the least, either way.
    assert book.partition_for(relquery("q3")) == 0
    # A fresh report of b resets what was sent to it since.
    book.take(report("b", [2, 3], 0.0, at=NOW + 0.5), HEADERS)
    assert book.partition_for(relquery("q4")) == 3
    # An older report of b than the one it has is ignored.
    book.take(report("b", [2, 3], 9.0, at=NOW), HEADERS)
    assert book.engines() == ["a", "b"]
    assert book.partition_for(relquery("q5")) == 2


def test_among_tied_engines_the_one_that_served_the_template_wins(book):
    book.take(report("a", [0], 1.0), HEADERS)
    book.take(report("b", [1], 1.05, templates=[template_id("Say {x}.")]), HEADERS)
    assert book.partition_for(relquery()) == 1
    assert book.partition_for(relquery(template="Other {x}.")) == 0


def test_prompt_tokens_are_estimated_from_characters():
    # 2 rows of ("Say {x}." 8 chars + "abcd" 4 chars) = 24 characters, 4 a token.
    assert prompt_tokens(relquery()) == 6


def test_placement_is_asked_or_taken_from_the_environment(monkeypatch):
    monkeypatch.delenv("RELSTREAM_PLACEMENT", raising=False)
    assert placement_of(None) == "load"
    monkeypatch.setenv("RELSTREAM_PLACEMENT", "hash")
    assert placement_of(None) == "hash"
    assert placement_of("load") == "load"
    with pytest.raises(ValueError, match="RELSTREAM_PLACEMENT='random'"):
        monkeypatch.setenv("RELSTREAM_PLACEMENT", "random")
        placement_of(None)


def test_the_sim_backend_reports_its_work_in_flight_at_its_speed():
    rows = [Row(f"r{k}", {"city": f"city-{k}"}) for k in range(8)]
    rq = RelQuery("x", Template("Describe {city}."), rows, 16)
    load_tokenizer()  # as the engine command does, so the relQuery is simulated at once
    fast = SimRelQueryBackend(SimSettings(time_scale=0.5))
    slow = SimRelQueryBackend(SimSettings(time_scale=0.5, speed=0.25))
    assert slow.load().per_output_token_s == pytest.approx(4 * fast.load().per_output_token_s)
    assert slow.load().per_prompt_token_s == pytest.approx(4 * fast.load().per_prompt_token_s)

    async def serve(backend):
        handle = await backend.submit(rq)
        await asyncio.sleep(0.2)
        during = backend.load()
        result = await handle.result()
        return during, result.latency.total, backend.load()

    during, alone, after = asyncio.run(serve(slow))
    # The relQuery takes 4 x its simulated latency in engine seconds, 0.2 s real = 0.4 s of it.
    assert during.outstanding_s == pytest.approx(4 * alone - 0.4, abs=0.2)
    assert after.outstanding_s == 0.0 and after.templates == (template_id("Describe {city}."),)
    with pytest.raises(ValueError, match="sim speed"):
        SimSettings(speed=0)
