"""The plug-in's waiting queue does what vLLM's FCFS queue does, removal aside in cost."""

import random

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.request_queue import FCFSRequestQueue

from relstream.engine.core.waitqueue import IndexedWaitingQueue


class Req:
    """A request as the queues see it: compared by identity."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def test_every_operation_leaves_the_order_of_vllms_queue():
    rng = random.Random(0)
    ours, vllms = IndexedWaitingQueue(), FCFSRequestQueue()
    outside: list[Req] = [Req(f"r{i}") for i in range(40)]
    for step in range(4000):
        inside = list(vllms)
        op = rng.randrange(7)
        if op == 0 and outside:
            request = outside.pop(rng.randrange(len(outside)))
            ours.add_request(request)
            vllms.add_request(request)
        elif op == 1 and outside:
            request = outside.pop(rng.randrange(len(outside)))
            ours.prepend_request(request)
            vllms.prepend_request(request)
        elif op == 2 and outside:
            batch = [outside.pop() for _ in range(min(len(outside), rng.randint(1, 4)))]
            ours.prepend_requests(iter(batch))
            vllms.prepend_requests(iter(batch))
        elif op == 3 and inside:
            assert ours.peek_request() is vllms.peek_request()
            request = ours.pop_request()
            assert request is vllms.pop_request()
            outside.append(request)
        elif op == 4 and inside:
            request = rng.choice(inside)
            ours.remove_request(request)
            vllms.remove_request(request)
            outside.append(request)
        elif op == 5 and inside:
            # vLLM's remove_requests ignores requests that do not wait
            gone = rng.sample(inside, min(len(inside), rng.randint(1, 5)))
            stray = outside[:1]
            ours.remove_requests(gone + stray)
            vllms.remove_requests(gone + stray)
            outside.extend(gone)
        assert list(ours) == list(vllms), step
        assert len(ours) == len(vllms) and bool(ours) == bool(vllms)


def test_an_empty_queue_and_a_missing_request_fail_as_vllms_do():
    queue = IndexedWaitingQueue()
    with pytest.raises(IndexError):
        queue.pop_request()
    with pytest.raises(IndexError):
        queue.peek_request()
    with pytest.raises(ValueError):
        queue.remove_request(Req("x"))
    assert IndexedWaitingQueue([first := Req("a"), Req("b")]).peek_request() is first
