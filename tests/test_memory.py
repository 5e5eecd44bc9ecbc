"""Bounded memory under hostile and large input: a real worker and engine (sim backend)
on a real broker take messages of 5 MB (rows and relQueries refused by size or bounds)
and valid relQueries of about 5 MB and 20,000 rows each, several at once. Each process's
RSS is sampled every 0.1 s; its growth over the baseline after start-up stays under the
bound stated here, and every message is answered or dead-lettered.

Tansu: noida-db refuses messages over 1 MiB."""

from relstream.bench.flood import report_table, run_flood
from relstream.kafka.brokers import EmbeddedBroker
from relstream.service.backlog import RowBudget

# Four valid 5 MB relQueries are held together (each charged 5,000 rows of the 20,000-row
# budget): 183 MB of engine growth measured; 430 MB when the sim backend held every
# prompt's token ids at once.
ENGINE_GROWTH_MB = 250
WORKER_GROWTH_MB = 100


def test_large_and_oversize_messages_keep_engine_and_worker_memory_bounded(tmp_path):
    with EmbeddedBroker("tansu", data_dir=tmp_path / "broker") as broker:
        report = run_flood(
            broker, tmp_path, count=300, seed=3, big_each=2, valid_relqueries=10,
            valid_rows=50, timeout=300, large=4, large_rows=20_000,
        )  # fmt: skip
    table = report_table(report)
    assert report.valid_sent == 14 and report.sent["relquery template 5 MB"] == 2, table
    assert report.lettered == report.sent, table  # every bad message, with its reason
    assert report.valid_answered == report.valid_sent, table  # the four large ones too
    assert report.rows_answered == report.rows_sent == 50, table
    assert report.alive == {"engine": True, "worker": True}, table
    assert report.rss_growth_mb("engine") < ENGINE_GROWTH_MB, table
    assert report.rss_growth_mb("worker") < WORKER_GROWTH_MB, table


def test_the_rows_held_stay_under_the_limit_whatever_the_charges():
    budget = RowBudget(20_000, held_limit=30_000)
    for name in ("a", "b", "c"):
        budget.offer(20_000, name)  # each charged 5,000: all three fit the budget
    assert budget.admit() == ["a"]  # b would hold 40,000 rows
    assert budget.held == 20_000 and budget.full
    budget.release(20_000)
    assert budget.admit() == ["b"] and budget.held == 20_000
    budget.release(20_000)
    assert budget.admit() == ["c"] and not budget.full
    alone = RowBudget(20_000, held_limit=10_000)
    alone.offer(50_000, "large")  # larger than the limit: admitted when nothing is held
    assert alone.admit() == ["large"] and alone.held == 50_000
    assert RowBudget(20_000).held_limit == 120_000  # the budget plus the largest relQuery
