"""The crash drill: engines and the worker SIGKILLed and started again with the same
command, an engine joining and leaving, the broker stopped and started, while rows flow;
its schedule and verdict on hand-made cases, and one short seed on each broker."""

import random
from collections import Counter
from pathlib import Path

import pytest

from relstream_lab.drills.crash import Settings, plan, run_crash
from relstream_lab.drills.crash_report import CrashReport, Fault, report_text


def test_the_faults_are_seeded_each_once_in_the_middle_of_the_stream_the_leaving_last():
    faults = plan(random.Random("faults 0"), 60.0, broker_restart=True, network=False)
    assert faults == plan(random.Random("faults 0"), 60.0, broker_restart=True, network=False)
    kinds = [kind for _, kind in faults]
    assert sorted(kinds) == ["broker", "join", "kill engine-a", "kill engine-b", "kill worker",
                             "leave"]  # fmt: skip
    assert kinds[-1] == "leave"
    times = [at for at, _ in faults]
    assert times == sorted(times) and times[-1] <= 51.0
    # Slots of 7.5 s from 6 s, each fault in the first half of its own.
    assert all(6.0 + 7.5 * i <= at <= 6.0 + 7.5 * i + 3.75 for i, at in enumerate(times))
    memory = [k for _, k in plan(random.Random("faults 0"), 60.0, False, network=False)]
    assert "broker" not in memory and len(memory) == 5
    orders = {tuple(k for _, k in plan(random.Random(f"faults {s}"), 60, True)) for s in range(8)}
    assert len(orders) > 1
    # With the connections' faults (the default): resets, a stall, a revocation in a
    # stall too, in slots of 5 s from 6 s.
    network = plan(random.Random("faults 0"), 60.0, broker_restart=True)
    assert sorted(k for _, k in network) == sorted([*kinds, "resets", "stall", "revoke"])
    assert network[-1][1] == "leave"
    assert all(6.0 + 5 * i <= at <= 6.0 + 5 * i + 2.5 for i, (at, _) in enumerate(network))


def test_a_result_seen_late_breaks_the_visibility_promise():
    report = _report()
    report.visible_after = [0.2, 1.5, 4.0]
    assert report.holds
    assert "median 1.5 s, p99 4.0 s, max 4.0 s" in report_text(report)
    report.visible_after.append(31.0)  # held back by a dead writer's transaction
    assert not report.checks()["every result visible within 30 s of its completion"]


def _report(broker: str = "kafka") -> CrashReport:
    report = CrashReport(seed=0, broker=broker, serve_within_s=30.0)
    report.rows_keys, report.bad_keys = {"row-0", "row-1", "row-2"}, {"bad-3"}
    report.seen = Counter({"row-0": 1, "row-1": 1, "row-2": 1, "bad-3": 1})
    report.stored = Counter({"row-0": 1, "row-1": 1, "row-2": 1})
    report.result_parts = Counter({("q-0", 0): 1, ("q-1", 0): 1})
    report.relquery_ids = {"q-0": 0, "q-1": 3}
    report.alive = {"engine-a": True, "engine-b": True, "worker": True}
    report.faults = [Fault(3.0, "SIGKILL engine-a", "engine-a", 11, ready_s=4.0, watched_s=4.0)]
    return report


def test_the_verdict_names_each_broken_promise():
    assert _report().holds
    twice = _report()
    twice.result_parts[("q-1", 0)] = 2
    twice.seen["row-2"] = 2
    checks = twice.checks()
    assert not checks["one result per relQuery id (read_committed)"]
    assert not checks["every row in exactly one result row or dead letter"]
    assert twice.duplicate_ids == {"q-1"} and twice.not_once()["repeated"] == {"row-2"}
    assert "with more than one result: 1 ['q-1']" in report_text(twice)
    lost = _report()
    lost.seen["row-1"] = 0
    lost.relquery_ids["q-2"] = 1
    assert lost.not_once()["missing"] == {"row-1"} and lost.unanswered == {"q-2"}
    assert not lost.holds
    assert "dead-lettered: 1 ['q-2']; by relQuery partition: {1: 1}" in report_text(lost)
    # Never ready: late once watched for the limit, not if it left sooner.
    late = _report()
    late.faults = [Fault(3.0, "SIGKILL worker", "worker", 12, watched_s=30.0)]
    assert late.slow and not late.holds
    left = _report()
    left.faults = [Fault(3.0, "engine-c joins", "engine-c", 13, watched_s=5.0)]
    assert not left.slow and left.holds
    dead = _report()
    dead.alive["worker"] = False
    assert not dead.checks()["every process alive at the end"]


def test_without_transactions_results_may_repeat_but_the_sink_stores_each_row_once():
    report = _report("tansu")
    report.result_parts[("q-1", 0)] = 2
    report.seen["row-2"] = 2
    assert report.holds
    report.stored["row-2"] = 0
    assert report.not_once()["not stored"] == {"row-2"} and not report.holds


def _gone(pid: int) -> bool:
    """The process has exited and been reaped (or its id now names another program)."""
    cmdline = Path(f"/proc/{pid}/cmdline")
    return not cmdline.exists() or b"relstream" not in cmdline.read_bytes()


def _short(tmp_path: Path, memory: bool) -> CrashReport:
    # Without the connections' faults: in 24 s they overlap every other fault, and there
    # this short run still finds a relQuery answered twice or rows unanswered in about one
    # run in four (issue 48, open); `relstream-lab drill crash` runs them over 60 s.
    settings = Settings(
        memory=memory, duration=24, rate=10, broker_down=3, timeout=45, network=False
    )
    return run_crash(tmp_path, seed=0, settings=settings)


@pytest.mark.slow
def test_on_the_memory_broker_the_sink_stores_each_row_once_through_every_crash(tmp_path):
    report = _short(tmp_path, memory=True)
    text = report_text(report)
    assert [f.what.split()[0] for f in report.faults].count("SIGKILL") == 3, text
    assert len(report.rows_keys) > 100, text
    assert all(_gone(pid) for pid in report.pids), text
    assert report.holds, text


@pytest.mark.slow
def test_on_the_default_broker_every_row_is_answered_once_through_every_crash(tmp_path):
    # On 1d50ea0 restarted members never rejoined (noida-db never evicts a SIGKILLed one)
    # and, with no transactions, replays answered relQueries twice: the drill failed.
    # Static members and the broker's transactions make it hold.
    report = _short(tmp_path, memory=False)
    text = report_text(report)
    assert not report.error, text
    assert len(report.faults) == 6 and report.faults[-1].what.startswith("engine-c leaves"), text
    assert len(report.pids) == 7, text  # two engines, the worker, three restarts, the joiner
    assert report.visible_after, text
    assert all(_gone(pid) for pid in report.pids), text
    assert report.waited_s <= 45 + 5, text
    assert len(report.rows_keys) > 100 and report.bad_keys, text
    assert report.holds, text
