"""Identical requests computed once: who leads, who follows, and what a follower does
when its leader does not finish (relstream.engine.shared, without vLLM)."""

import asyncio

from relstream.answers import Sampling
from relstream.engine.shared import Answer, SharedRequests, request_key
from relstream.model import RelQuery, Row, Template

GREEDY = Sampling()


def relquery(sampling: Sampling = GREEDY) -> RelQuery:
    return RelQuery("q", Template("{x}"), [Row("r", {"x": "1"})], 4, sampling=sampling)


def test_only_greedy_or_seeded_requests_have_a_key():
    assert request_key(relquery(), [1, 2]) is not None
    assert request_key(relquery(Sampling(0.8, seed=3)), [1, 2]) is not None
    assert request_key(relquery(Sampling(0.8)), [1, 2]) is None  # meant to differ
    greedy = relquery()
    assert request_key(greedy, [1, 2]) == request_key(greedy, [1, 2])
    assert request_key(greedy, [1, 2]) != request_key(greedy, [1, 3])
    assert request_key(greedy, [1, 2]) != request_key(relquery(Sampling(0.0, seed=1)), [1, 2])


def test_the_first_leads_and_the_others_get_its_answer():
    async def scenario():
        shared = SharedRequests()
        key = request_key(relquery(), [5, 6])
        leads, future = shared.follow_or_lead(key)
        follows, same = shared.follow_or_lead(key)
        waiting = asyncio.ensure_future(shared.answer_of(same))
        future.set_result(Answer("text", None))
        answer = await waiting
        await asyncio.sleep(0)  # the finished leader leaves the table
        again, _ = shared.follow_or_lead(key)
        return leads, follows, same is future, answer, shared.followed, again

    assert asyncio.run(scenario()) == (True, False, True, Answer("text", None), 1, True)


def test_a_leader_that_does_not_finish_leaves_its_followers_to_run_alone():
    async def scenario():
        shared = SharedRequests()
        _, future = shared.follow_or_lead(request_key(relquery(), [5]))
        waiting = asyncio.ensure_future(shared.answer_of(future))
        await asyncio.sleep(0)
        future.set_result(None)
        return await waiting, shared.followed

    assert asyncio.run(scenario()) == (None, 0)


def test_a_cancelled_follower_leaves_the_leader_running():
    async def scenario():
        shared = SharedRequests()
        key = request_key(relquery(), [5])
        _, future = shared.follow_or_lead(key)
        _, same = shared.follow_or_lead(key)
        follower = asyncio.ensure_future(shared.answer_of(same))
        await asyncio.sleep(0)
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        return future.cancelled(), future.done()

    assert asyncio.run(scenario()) == (False, False)


def test_a_request_without_a_key_leads_alone():
    async def scenario():
        return SharedRequests().follow_or_lead(None)

    assert asyncio.run(scenario()) == (True, None)
