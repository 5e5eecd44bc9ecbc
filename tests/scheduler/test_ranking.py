"""The ranking objects: one order per policy, a queue that moves only what is re-ranked."""

from helpers import ScriptedView

from relstream.scheduler.data import EngineLimits
from relstream.scheduler.ranking import RankedQueue, StaticRanking


def test_the_static_rank_is_prompt_tokens_plus_output_budget_then_arrival():
    # a: 3 rows of 100 tokens, 5 outputs each: 300 + 15 = 315. b: 1 row of 300, 15
    # outputs: 315 too, but it came later. c: 1 row of 10, 5 outputs: 15, first.
    view = ScriptedView(EngineLimits(64, 512, 100_000, 16))
    view.add_relquery("a", [100] * 3, max_tokens=5, arrival=1.0)
    view.add_relquery("b", [300], max_tokens=15, arrival=2.0)
    view.add_relquery("c", [10], max_tokens=5, arrival=3.0)
    ranking = StaticRanking()
    ranks = sorted(ranking.rank(info, 0.0) for info in view.tracker.relqueries.values())
    assert ranks == [(0, 15, 3.0, "c"), (0, 315, 1.0, "a"), (0, 315, 2.0, "b")]  # class 0 each


def test_the_queue_re_ranks_and_forgets():
    queue = RankedQueue()
    queue.put("a", (3, "a"))
    queue.put("b", (1, "b"))
    queue.put("c", (2, "c"))
    queue.put("b", (4, "b"))  # b re-ranked behind the others
    queue.drop("c")
    queue.drop("missing")  # dropping what is not there is no error
    assert [rank[-1] for rank in queue] == ["a", "b"]
    assert len(queue) == 2 and "c" not in queue and queue.rank_of("b") == (4, "b")
