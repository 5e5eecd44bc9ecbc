"""`relstream-lab bench priority` on a small backfill: every policy with and without
classes, the live relQuery's ratio and the backfill's growth as the report says them."""

import json

from click.testing import CliRunner

from relstream_lab.cli import main
from relstream_lab.priority.run import summarize


def test_a_small_backfill_is_reported_with_and_without_classes(tmp_path):
    args = [
        "bench", "priority", "--bundled", "--profiles", "cpu-smollm2",
        "--policies", "relstream,v1-fcfs", "--seeds", "0", "--backfill", "6",
        "--backfill-rows", "60", "--live", "2", "--live-max-rows", "4",
        "--workers", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    by_policy = {run["policy"]: run for run in runs}
    assert set(by_policy) == {"relstream", "v1-fcfs"}
    ours = by_policy["relstream"]
    assert len(ours["idle"]) == 2 and set(ours["classes"]["live"]) == set(ours["idle"])
    growth = summarize(ours, "classes")["growth"]
    assert growth == ours["classes"]["backfill_makespan"] / ours["backfill_makespan_alone"] - 1
    # FCFS ignores classes: the same runs either way.
    fcfs = by_policy["v1-fcfs"]
    assert fcfs["classes"]["live"] == fcfs["no_classes"]["live"]
    assert "| cpu-smollm2 | 0 | relstream |" in (tmp_path / "README.md").read_text()


def test_the_real_engines_report_says_each_ratio(tmp_path):
    from relstream_lab.priority.real import rebuild_real_report

    run = {"seed": 0, "live_rows": 12, "idle": 2.0, "alone": {"backfill_makespan": 100.0},
           "classes": {"live": 2.5, "backfill_makespan": 102.0},
           "no_classes": {"live": 20.0, "backfill_makespan": 95.0}}  # fmt: skip
    document = {"command": "bench priority --backend vllm", "machine": "m", "runs": [run]}
    (tmp_path / "results.json").write_text(json.dumps(document))
    rebuild_real_report(tmp_path)
    row = "| 0 | 12 | 2.00 s | 2.50 s | 1.25x | +2.0% | +7.4% | 20.00 s | 10.00x |"
    assert row in (tmp_path / "README.md").read_text()
