"""`bench kv-bound`: long outputs drawn in their range, ratios and verdicts a person can
compute, and a small run end to end."""

import json

import pytest

from relstream_lab.common.workload import (
    TraceConfig,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
)
from relstream_lab.kvbound.run import (
    KvBoundOptions,
    ratios,
    rebuild_report,
    run_kv_bound,
    verdicts,
)


def test_long_outputs_are_drawn_in_their_range_under_their_budget():
    config = TraceConfig(num_relqueries=5, max_rows=8, seed=1, outputs=(256, 512))
    trace = tokenize_trace(generate_relqueries(config, load_datasets(None)), config)
    lengths = [n for rows in trace.output_lengths.values() for n in rows]
    assert all(256 <= n <= 512 for n in lengths) and len(set(lengths)) > 1
    assert {e.relquery.max_output_tokens for e in trace.entries} == {512}
    with pytest.raises(ValueError, match="outputs range"):
        TraceConfig(outputs=(10, 5))


def run(policy, load, mean, makespan, seed=0):
    return {"profile": "p", "seed": seed, "load": load, "policy": policy, "mean": mean,
            "makespan": makespan}  # fmt: skip


def test_ratios_and_verdicts_judge_the_worst_seed():
    runs = [
        # load 1, seed 0: the better stock mean 30 / relstream's 25 = 1.2; makespan
        # 103 / the better stock's 100 = 1.03 (holds, at the bound)
        run("relstream", 1.0, 25, 103), run("v1-fcfs", 1.0, 30, 100),
        run("v1-priority", 1.0, 32, 101),
        # seed 1: 24 / 30 = 0.8 below 1 (missed); makespan 100 / 100
        run("relstream", 1.0, 30, 100, seed=1), run("v1-fcfs", 1.0, 24, 100, seed=1),
        run("v1-priority", 1.0, 40, 100, seed=1),
        # load 0.75: 30 / 20 = 1.5 (holds, at the bound)
        run("relstream", 0.75, 20, 90), run("v1-fcfs", 0.75, 30, 90),
        run("v1-priority", 0.75, 31, 90),
    ]  # fmt: skip
    by_cell = {(r["load"], r["seed"]): r for r in ratios(runs)}
    assert by_cell[(1.0, 0)]["mean_ratio"] == pytest.approx(1.2)
    assert by_cell[(1.0, 0)]["worst_mean_ratio"] == pytest.approx(32 / 25)
    assert by_cell[(1.0, 0)]["makespan_ratio"] == pytest.approx(1.03)
    assert by_cell[(1.0, 1)]["mean_ratio"] == pytest.approx(0.8)
    judged = {v["line"]: (v["worst_seed"], v["holds"]) for v in verdicts(runs)}
    assert judged == {
        "load 1: makespan / better stock V1's": (pytest.approx(1.03), True),
        "load 1: better stock V1's mean / relstream's": (pytest.approx(0.8), False),
        "load 0.75: better stock V1's mean / relstream's": (pytest.approx(1.5), True),
    }


def small_run(out_dir, relqueries: int, max_rows: int, outputs: tuple[int, int]) -> dict:
    """Three policies at load 1 on the bundled table, one seed, on a100-opt13b."""
    trace = TraceConfig(num_relqueries=relqueries, max_rows=max_rows, outputs=outputs)
    return run_kv_bound(KvBoundOptions(
        profiles=("a100-opt13b",), policies=("relstream", "v1-fcfs", "v1-priority"),
        loads=(1.0,), seeds=(0,), trace=trace, datasets_dir=None, out_dir=out_dir, workers=1,
    ))  # fmt: skip


def test_a_small_run_writes_every_policy_at_every_load(tmp_path):
    document = small_run(tmp_path, 4, 6, (64, 128))
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert sorted(r["policy"] for r in runs) == ["relstream", "v1-fcfs", "v1-priority"]
    assert all(r["relqueries"] == 4 and r["capacity"] > 0 for r in runs)
    assert len(document["verdicts"]) == 2  # load 1's two lines; no 0.75 in this run
    assert "## a100-opt13b" in (tmp_path / "README.md").read_text()


def test_the_report_is_rebuilt_from_results_with_the_notes(tmp_path):
    small_run(tmp_path, 3, 4, (32, 64))
    first = (tmp_path / "README.md").read_text()
    (tmp_path / "notes.md").write_text("Hand-written analysis.\n")
    rebuild_report(tmp_path)
    assert (tmp_path / "README.md").read_text() == first + "\n## Notes\n\nHand-written analysis.\n"
