"""Identical requests computed once and answers remembered: who leads, who follows, what a
follower does when its leader does not finish, and the answer cache's byte cap
(relstream.engine.twins and relstream.engine.answers, without vLLM)."""

import asyncio
import os
import subprocess
import sys

from relstream.engine.answers import (
    ENTRY_OVERHEAD_BYTES,
    AnswerCache,
    SharedOutcome,
    request_key,
)
from relstream.engine.twins import SharedRequests
from relstream.model import RelQuery, Row, Template
from relstream.outputspec import Sampling

GREEDY = Sampling()


def relquery(sampling: Sampling = GREEDY) -> RelQuery:
    return RelQuery("q", Template("{x}"), [Row("r", {"x": "1"})], 4, sampling=sampling)


MODEL = "smollm2"


def key(*token_ids: int):
    return request_key(relquery(), list(token_ids), MODEL)


# key(1, 2)'s digest, computed by another interpreter from the product alone.
KEY_IN_ANOTHER_PROCESS = f"""
from relstream.engine.answers import request_key
from relstream.model import RelQuery, Row, Template
relquery = RelQuery("q", Template("{{x}}"), [Row("r", {{"x": "1"}})], 4)
print(request_key(relquery, [1, 2], {MODEL!r}).digest.hex())
"""


def test_only_greedy_or_seeded_requests_have_a_key():
    assert request_key(relquery(Sampling(0.8, seed=3)), [1, 2], MODEL) is not None
    assert request_key(relquery(Sampling(0.8)), [1, 2], MODEL) is None  # meant to differ
    assert key(1, 2) == key(1, 2) and key(1, 2) != key(1, 3)
    assert key(1, 2) != request_key(relquery(Sampling(0.0, seed=1)), [1, 2], MODEL)


def test_the_digest_holds_the_model_and_stays_the_same_across_processes():
    other_model = request_key(relquery(), [1, 2], "another-model")
    assert key(1, 2).digest == key(1, 2).digest != other_model.digest
    assert len(key(1, 2).digest) == 32  # SHA-256
    # A restarted engine must find what an earlier one published: another interpreter
    # (another hash seed) computes the same digest.
    other = subprocess.run(
        [sys.executable, "-c", KEY_IN_ANOTHER_PROCESS],
        env={**os.environ, "PYTHONHASHSEED": "12345"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert other.stdout.strip() == key(1, 2).digest.hex()


def test_the_first_leads_and_the_others_get_its_answer():
    async def scenario():
        shared = SharedRequests()
        leader, follower = shared.role(key(5, 6)), shared.role(key(5, 6))
        waiting = asyncio.ensure_future(shared.answer_of(follower))
        shared.settle(leader, SharedOutcome("text", 1))
        answer = await waiting
        return leader.leads, follower.leads, answer, shared.followed, shared.role(key(5, 6)).leads

    assert asyncio.run(scenario()) == (True, False, SharedOutcome("text", 1), 1, True)


def test_a_leader_that_does_not_finish_leaves_its_followers_to_run_alone():
    async def scenario():
        shared = SharedRequests(AnswerCache(10_000))
        leader, follower = shared.role(key(5)), shared.role(key(5))
        waiting = asyncio.ensure_future(shared.answer_of(follower))
        shared.settle(leader, None)
        return await waiting, shared.followed, shared.cache.bytes

    assert asyncio.run(scenario()) == (None, 0, 0)  # and nothing was cached


def test_a_cancelled_follower_leaves_the_leader_running():
    async def scenario():
        shared = SharedRequests()
        leader, follower = shared.role(key(5)), shared.role(key(5))
        waiting = asyncio.ensure_future(shared.answer_of(follower))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        return leader.future.cancelled(), leader.future.done()

    assert asyncio.run(scenario()) == (False, False)


def test_a_finished_answer_is_served_from_the_cache_without_its_step_times():
    async def scenario():
        shared = SharedRequests(AnswerCache(10_000))
        shared.settle(shared.role(key(7)), SharedOutcome("seven", 2, times="step times"))
        again = shared.role(key(7))
        return again.cached, again.leads, shared.cache.hits, shared.cache.misses

    assert asyncio.run(scenario()) == (SharedOutcome("seven", 2), True, 1, 1)


def test_the_cache_evicts_the_least_recently_used_under_its_byte_cap():
    # Each entry: a 32-byte digest + its text + the overhead = 32 + 1 + 256.
    entry = 32 + 1 + ENTRY_OVERHEAD_BYTES
    cache = AnswerCache(max_bytes=2 * entry + 10)
    cache.put(key(1).digest, SharedOutcome("a", 1))
    cache.put(key(2).digest, SharedOutcome("b", 1))
    assert cache.get(key(1).digest) is not None  # 1 is now the more recently used
    cache.put(key(3).digest, SharedOutcome("c", 1))  # over the cap: 2 goes
    assert cache.get(key(2).digest) is None
    assert cache.get(key(1).digest) and cache.get(key(3).digest)
    assert cache.bytes == 2 * entry <= cache.max_bytes
    cache.put(
        key(4).digest, SharedOutcome("x" * 10_000, 1)
    )  # larger than the whole cache: not kept
    assert cache.get(key(4).digest) is None and cache.bytes == 2 * entry


def test_only_answers_this_engine_computed_are_passed_on():
    # The service publishes what `on_new` hears; answers read from the topic (`put`) and
    # answers already held are not published again.
    heard = []
    cache = AnswerCache(10_000, MODEL)
    cache.on_new = lambda digest, answer: heard.append((digest, answer))

    async def scenario():
        shared = SharedRequests(cache)
        cache.put(key(1).digest, SharedOutcome("from the topic", 3))
        shared.settle(shared.role(key(2)), SharedOutcome("computed", 2, times="step times"))
        cache.remember(key(2).digest, SharedOutcome("computed", 2))  # held already
        return shared.role(key(1)).cached

    assert asyncio.run(scenario()) == SharedOutcome("from the topic", 3)
    assert heard == [(key(2).digest, SharedOutcome("computed", 2))]


def test_settling_twice_keeps_the_first_outcome():
    # The engine settles a leader with its answer, then again with None when its task
    # ends (for a leader cancelled before it ran): the answer stands.
    async def scenario():
        shared = SharedRequests()
        leader, follower = shared.role(key(9)), shared.role(key(9))
        shared.settle(leader, SharedOutcome("nine", 1))
        shared.settle(leader, None)
        return await shared.answer_of(follower)

    assert asyncio.run(scenario()) == SharedOutcome("nine", 1)


def test_a_follower_never_settles_its_leader():
    async def scenario():
        shared = SharedRequests()
        leader, follower = shared.role(key(4)), shared.role(key(4))
        shared.settle(follower, None)  # a follower's task ended (its relQuery cancelled)
        still_running = not leader.future.done()
        shared.settle(leader, SharedOutcome("four", 1))
        return still_running, await shared.answer_of(follower)

    assert asyncio.run(scenario()) == (True, SharedOutcome("four", 1))


def test_a_json_schema_output_is_part_of_the_key_with_its_property_order():
    # Constrained decoding generates an object's properties in the schema's order, so
    # {reasoning, answer} and {answer, reasoning} get different answers: the schema is
    # kept as written, never sorted.
    from relstream.outputspec import OutputSpec

    def keyed(properties: dict):
        schema = {"type": "object", "properties": properties, "required": list(properties)}
        output = OutputSpec.build(json_schema=schema)
        return request_key(
            RelQuery("q", Template("{x}"), [Row("r", {"x": "1"})], 4, output=output), [1], MODEL
        )

    text = {"type": "string"}
    first = keyed({"reasoning": text, "answer": text})
    assert first == keyed({"reasoning": text, "answer": text}) != key(1)
    assert first.digest != keyed({"answer": text, "reasoning": text}).digest
    nested = {"a": {"type": "object", "properties": {"x": text, "y": text}}}
    swapped = {"a": {"type": "object", "properties": {"y": text, "x": text}}}
    assert keyed(nested).digest != keyed(swapped).digest


def test_an_aborted_output_is_neither_shared_nor_cached():
    # Only answers that ended by stop or length stand for the request: an aborted (or
    # errored, or repetition-stopped) leader leaves its followers to run alone.
    async def scenario(ending: str):
        shared = SharedRequests(AnswerCache(10_000))
        leader, follower = shared.role(key(8)), shared.role(key(8))
        waiting = asyncio.ensure_future(shared.answer_of(follower))
        shared.settle(leader, SharedOutcome("half an ans", 3, finish_reason=ending))
        return await waiting, shared.cache.bytes, shared.role(key(8)).cached

    for ending in ("abort", "error", "repetition", None):
        assert asyncio.run(scenario(ending)) == (None, 0, None)
    assert asyncio.run(scenario("length"))[0] == SharedOutcome(
        "half an ans", 3, finish_reason="length"
    )
    heard = []
    cache = AnswerCache(10_000, MODEL)
    cache.on_new = lambda digest, answer: heard.append(answer)
    cache.remember(key(8).digest, SharedOutcome("half an ans", 3, finish_reason="abort"))
    assert heard == [] and len(cache) == 0


def test_a_later_answer_replaces_the_earlier_one_and_drop_removes_it():
    # As the answers topic does: a later write under a key wins, a tombstone removes it.
    cache = AnswerCache(10_000, MODEL)
    assert cache.put(key(1).digest, SharedOutcome("first", 1))
    assert not cache.put(key(1).digest, SharedOutcome("first", 1))  # the same: nothing new
    assert cache.put(key(1).digest, SharedOutcome("second, longer", 2))
    assert cache.get(key(1).digest) == SharedOutcome("second, longer", 2)
    assert cache.bytes == AnswerCache.entry_bytes(key(1).digest, SharedOutcome("second, longer", 2))
    assert cache.drop(key(1).digest) and not cache.drop(key(1).digest)
    assert cache.bytes == 0 and key(1).digest not in cache
