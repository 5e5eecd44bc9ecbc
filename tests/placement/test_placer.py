"""The placer's book of load reports, on hand-computed cases; the sim backend's load."""

import asyncio

import msgpack
import msgspec
import pytest

from relstream.engine.tokenizer import load_tokenizer
from relstream.model import RelQuery, Row, Template
from relstream.placement.book import LoadBook, placement_of, prompt_tokens
from relstream.placement.load import size_class, template_id
from relstream.placement.reports import HEADERS
from relstream.sim.backend import SimRelQueryBackend, SimSettings
from relstream.wire import LoadReportMessage, RelQueryMessage, RelQueryRow, encode

TOPIC = "relstream.relqueries"
NOW = 1000.0


def report(
    engine, partitions, outstanding, at=NOW, per_output=0.01, templates=(), topic=TOPIC, sizes=()
):
    message = LoadReportMessage(
        engine=engine,
        topic=topic,
        partitions=list(partitions),
        outstanding_s=outstanding,
        per_output_token_s=per_output,
        templates=list(templates),
        size_counts=list(sizes),
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
    assert not book.take(report("a", [0], 1.0, at=NOW - 3.5), HEADERS)  # busy, over 3 s
    assert not book.take(report("a", [0], 0.0, at=NOW - 751), HEADERS)  # idle, over 750 s
    assert book.partition_for(relquery()) is None
    assert book.take(report("a", [], 0.0), HEADERS)  # owns no partition (yet)
    assert book.partition_for(relquery()) is None
    # An idle engine repeats its report only every 300 s: trusted 750 s.
    assert book.take(report("c", [1], 0.0, at=NOW - 400), HEADERS)
    assert book.partition_for(relquery()) == 1


def test_only_load_reports_of_its_topic_count(book):
    assert not book.take(report("a", [0], 0.0), None)  # no header: a metrics message
    assert not book.take(report("a", [0], 0.0, topic="other.relqueries"), HEADERS)
    assert not book.take(b"\x81\xa1x\x01", HEADERS)  # not a load report: logged, ignored
    assert book.engines() == []


def test_the_least_loaded_engine_takes_it_counting_what_was_sent_since(book):
    # Each relQuery: 2 rows x 10 tokens = 20 output tokens at 0.01 s = 0.2 s (prompts free).
    book.take(report("a", [0, 1], 1.0), HEADERS)
    book.take(report("b", [2, 3], 0.5), HEADERS)
    # Neither counts its relQueries by size (older engines): the least work decides.
    # b: 0.5 → 0.7 → 0.9 → 1.1 s (partitions 2, 3 in turn, a's 1.0 s over 0.99 at q2),
    # then a.
    assert [book.partition_for(relquery(f"q{i}")) for i in range(4)] == [2, 3, 2, 0]
    # A fresh report of b resets what was sent to it since: 0 s, the least.
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


def test_where_it_delays_fewest_comes_from_the_reports_size_counts(book):
    # Each relQuery: 0.2 s (class 5). a: 1.0 s, nothing counted (an engine of the previous
    # release: its report has no size_counts, so it would look as if it delayed none);
    # b: 0.7 s, four relQueries of 0.5 s (class 7). a is near the least and uncounted:
    # the least work decides, b.
    old = msgpack.unpackb(report("a", [0], 1.0))
    assert "size_counts" not in old  # left out at its default, as older readers expect
    assert book.take(msgpack.packb(old), HEADERS)
    assert book.take(report("b", [1], 0.7, sizes=[0] * 7 + [4]), HEADERS)
    assert book.partition_for(relquery()) == 1
    # a upgraded: one relQuery of 0.25 s (class 6) counted. Now b, 0.9 s, would delay its
    # four larger ones and a its one: a, within 50 % of b.
    assert book.take(report("a", [0], 1.0, at=NOW + 0.1, sizes=[0] * 6 + [1]), HEADERS)
    assert book.partition_for(relquery("q1")) == 0
    # Not finite (a fit gone wrong, or a writer's bug): ignored, and logged.
    assert not book.take(report("d", [3], float("inf")), HEADERS)
    assert not book.take(report("d", [3], 1.0, per_output=float("nan")), HEADERS)
    # Bounded: a report with more classes than the wire allows is refused, and logged.
    assert not book.take(report("c", [2], 0.0, sizes=[1] * 17), HEADERS)


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
        at_once = backend.load()  # before it is simulated: its estimate
        await asyncio.sleep(0.2)
        during = backend.load()
        result = await handle.result()
        return at_once, during, result.latency.total, backend.load()

    at_once, during, alone, after = asyncio.run(serve(slow))
    # Counted before it is simulated: 8 rows of 16 outputs and "Describe {city}." (16 chars,
    # 4 tokens) at the slow engine's prices, each row's value left out.
    prices = slow.load()
    assert at_once.outstanding_s == pytest.approx(
        8 * (4 * prices.per_prompt_token_s + 16 * prices.per_output_token_s), rel=0.01
    )
    # The relQuery takes 4 x its simulated latency in engine seconds, 0.2 s real = 0.4 s of it.
    assert during.outstanding_s == pytest.approx(4 * alone - 0.4, abs=0.2)
    assert after.outstanding_s == 0.0 and after.templates == (template_id("Describe {city}."),)
    # One relQuery in flight, counted in the size class of what it has left.
    assert during.size_counts[size_class(during.outstanding_s)] == 1 == sum(during.size_counts)
    assert after.size_counts == ()
    with pytest.raises(ValueError, match="sim speed"):
        SimSettings(speed=0)


def test_a_report_is_taken_only_if_current_of_known_partitions_and_signed_if_asked():
    from relstream.placement.book import MAX_SKEW_S
    from relstream.placement.reports import signed

    book = LoadBook(TOPIC, clock=lambda: NOW, partitions=2)
    assert not book.take(report("a", [2], 0.0), HEADERS)  # partitions 0 and 1 only
    assert not book.take(report("a", [0], 0.0, at=NOW + MAX_SKEW_S + 0.1), HEADERS)
    assert book.take(report("a", [1], 0.0, at=NOW + MAX_SKEW_S), HEADERS)  # within the skew
    assert dict(book.ignored) == {
        "names a partition the topic does not have": 1,
        "dated in the future": 1,
    }
    secret = b"s" * 16
    book = LoadBook(TOPIC, clock=lambda: NOW, secret=secret)
    sound = LoadReportMessage(engine="a", topic=TOPIC, partitions=[0], outstanding_s=1.0, at=NOW)
    assert not book.take(encode(sound), HEADERS)  # unsigned
    assert not book.take(encode(signed(sound, b"t" * 16)), HEADERS)  # another secret
    forged = msgspec.structs.replace(signed(sound, secret), outstanding_s=0.0)
    assert not book.take(encode(forged), HEADERS)  # signed, then changed
    assert book.take(encode(signed(sound, secret)), HEADERS)
    assert dict(book.ignored) == {"unsigned": 1, "badly signed": 2}
