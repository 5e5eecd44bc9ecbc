"""The worker's windows belong to the assignment they were read under (issue 59, defect 2
in the worker): a rows partition revoked and handed back at once (a session expired) must
not commit the old assignment's windows with the new assignment's producer, which then
cuts and sends the same windows again."""

import asyncio

import pytest
from aiokafka import TopicPartition

from relstream.kafka.delivery.txfaults import Fenced
from relstream.stream.commits import WindowCommits

P = TopicPartition("relstream.rows.reviews", 0)


class Delivered:
    """The delivery layer's side a commit reaches: each transaction's offset commit, asked
    as `Transacted.deliver` asks it (inside the transaction); `before` runs first, as a
    rebalance that lands while the transaction is open."""

    exactly_once = True

    def __init__(self, before=lambda: None) -> None:
        self.committed: list[tuple[int, str]] = []
        self.before = before

    async def deliver(self, partition, parts, at, stalled) -> None:
        self.before()
        self.committed.append(at())


def test_a_step_read_under_an_ended_assignment_commits_nothing():
    commits = WindowCommits(Delivered(), "relstream.deadletter")
    old = commits.lease(P)
    commits.forget(P)  # revoked...
    new = commits.lease(P)  # ...and handed back before the old step committed
    assert new != old
    assert asyncio.run(commits.commit(P, [], 7, lambda: None, old)) is False
    assert commits.outputs.committed == []
    assert asyncio.run(commits.commit(P, [], 7, lambda: None, new)) is True
    assert commits.outputs.committed == [(7, "")]


def test_a_hand_back_during_the_transaction_aborts_it():
    commits = WindowCommits(Delivered(), "relstream.deadletter")
    lease = commits.lease(P)

    def handed_back() -> None:
        commits.forget(P)
        commits.lease(P)

    commits.outputs.before = handed_back
    with pytest.raises(Fenced):  # `commit` turns it into False once the layer raises it
        asyncio.run(commits.outputs.deliver(P, [], lambda: commits._at(P, 7, lease), None))
    assert commits.outputs.committed == []
