"""The check that makes vLLM's scheduler tests a contract (`tests/conformance/check.py`,
run by `make test-vllm-conformance`): hand-made outcomes against a hand-made table, and
the table in docs/architecture/engine.md read as the check reads it."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check", ROOT / "tests/conformance/check.py")
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)

DOC = """# Doc
### vLLM's scheduler tests
| Test (`tests/v1/core/`) | Cases | Why |
|---|---|---|
| `test_scheduler.py::test_order` | all | size order |
| `test_scheduler.py::test_kv` | `[a]`, `[b]` | held |
| `test_scheduler.py::test_kv` | `[c]` | async loads |
| `test_scheduler.py::test_lora` | all (from 0.33) | a test 0.33 added |
### Next
| `test_scheduler.py::test_elsewhere` | all | not in the section |
"""
S = "tests/v1/core/test_scheduler.py::"


def write_runs(tmp_path, stock_failed, relstream_failed, tests, built=1, vllm="0.32.0"):
    for policy, failed in (
        ("stock", stock_failed),
        ("v1-fcfs", stock_failed),
        ("v1-priority", stock_failed),
        ("relstream", relstream_failed),
    ):
        outcomes = {S + t: "failed" if t in failed else "passed" for t in tests}
        classes = {} if policy == "stock" else dict.fromkeys(check.PLUGIN_CLASSES, built)
        run = {"vllm": vllm, "built": classes, "outcomes": outcomes}
        (tmp_path / f"{policy}.json").write_text(json.dumps(run))


def test_the_section_table_merges_a_tests_rows_and_stops_at_the_next_heading():
    assert check.documented(DOC, "0.32.0") == {
        "test_scheduler.py::test_order": "all",
        "test_scheduler.py::test_kv": ("[a]", "[b]", "[c]"),
    }


def test_a_row_from_a_later_release_holds_on_its_runs_only(tmp_path):
    assert check.documented(DOC, "0.33.0")["test_scheduler.py::test_lora"] == "all"
    listed = {"test_order[x]", "test_order[y]", "test_kv[a]", "test_kv[b]", "test_kv[c]"}
    write_runs(tmp_path, set(), listed | {"test_lora"}, [*TESTS, "test_lora"], vllm="0.33.0")
    assert check.check(tmp_path, DOC, check.POLICIES) == []
    write_runs(tmp_path, set(), listed | {"test_lora"}, [*TESTS, "test_lora"], vllm="0.32.0")
    assert check.check(tmp_path, DOC, check.POLICIES) == [
        f"relstream: newly fails {S}test_lora"
    ]


TESTS = ["test_order[x]", "test_order[y]", "test_kv[a]", "test_kv[b]", "test_kv[c]", "test_mm"]


def test_failures_equal_to_stock_and_the_table_pass(tmp_path):
    listed = {"test_order[x]", "test_order[y]", "test_kv[a]", "test_kv[b]", "test_kv[c]"}
    write_runs(tmp_path, {"test_mm"}, {"test_mm"} | listed, TESTS)
    assert check.check(tmp_path, DOC, check.POLICIES) == []


def test_a_new_failure_and_a_listed_test_now_passing_both_fail(tmp_path):
    failed = {"test_mm", "test_order[x]", "test_order[y]", "test_kv[a]", "test_kv[b]"}
    write_runs(
        tmp_path, {"test_mm"}, failed - {"test_kv[b]"} | {"test_extra"}, [*TESTS, "test_extra"]
    )
    assert check.check(tmp_path, DOC, check.POLICIES) == [
        f"relstream: newly fails {S}test_extra",
        f"relstream: newly passes {S}test_kv[b] (update the expected list)",
        f"relstream: newly passes {S}test_kv[c] (update the expected list)",
    ]


def test_a_row_naming_no_test_is_stale(tmp_path):
    write_runs(tmp_path, set(), {"test_order[x]"}, ["test_order[x]", "test_kv[a]"])
    problems = check.check(tmp_path, DOC, check.POLICIES)
    assert (
        "docs/architecture/engine.md lists test_scheduler.py::test_kv[b], "
        "which vLLM's tests do not hold" in problems
    )
    assert f"relstream: newly passes {S}test_kv[a] (update the expected list)" in problems


def test_the_architecture_doc_lists_relstreams_differences():
    rows = check.documented((ROOT / "docs/architecture/engine.md").read_text(), "0.33.0")
    assert "test_scheduler.py::test_schedule_order" in rows
    assert all(cases == "all" or cases for cases in rows.values())


def test_a_run_that_built_no_plug_in_fails(tmp_path):
    # Were vLLM's tests to build their schedulers from a name the plug-in does not
    # replace, every policy would run stock vLLM and match it.
    write_runs(tmp_path, set(), set(), ["test_order[x]"], built=0)
    problems = check.check(tmp_path, "### vLLM's scheduler tests\n", check.POLICIES)
    assert [p.split(":")[0] for p in problems] == ["v1-fcfs", "v1-priority", "relstream"]
