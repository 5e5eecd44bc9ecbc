"""The flood drill, short: 2,000 bad messages of every kind (several of 5 MB, over any
producer's 1 MiB limit) into a running worker and engine on a real broker, while valid
rows and relQueries stream through both. Tansu: noida-db refuses messages over 1 MiB."""

import pytest

from relstream.kafka.tools.brokers import EmbeddedBroker
from relstream_lab.drills.flood import KINDS, RSS_BOUND_MB, report_table, run_flood


@pytest.mark.slow
def test_a_flood_of_every_kind_is_dead_lettered_while_valid_work_is_answered(tmp_path):
    assert len(KINDS) >= 20 and sum(kind.big for kind in KINDS) >= 3
    with EmbeddedBroker("tansu", data_dir=tmp_path / "broker") as broker:
        report = run_flood(
            broker, tmp_path, count=2000, seed=0, big_each=2, valid_relqueries=20,
            valid_rows=100, timeout=300,
        )  # fmt: skip
    table = report_table(report)
    assert report.sent.keys() == {kind.name for kind in KINDS}, table
    assert report.lettered == report.sent, table  # each with a reason, none beside them
    assert all(report.reasons.values()), table
    assert report.valid_answered == report.valid_sent == 20, table
    assert report.rows_answered == report.rows_sent == 100, table
    assert report.alive == {"engine": True, "worker": True}, table
    for process, bound in RSS_BOUND_MB.items():
        assert report.rss_growth_mb(process) < bound, table
    # Nothing a producer sent printed a traceback in either process.
    for log in ("engine.log", "worker.log"):
        assert "Traceback" not in (tmp_path / log).read_text(), log
