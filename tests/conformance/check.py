"""Whether vLLM's scheduler tests, run under each policy, fail exactly where expected.

`make test-vllm-conformance` runs vLLM's tests/v1/core scheduler tests once on stock vLLM
and once per policy on relstream's plug-in (`vllm_conformance.py`), each run writing its
outcomes to OUT/<policy>.json. Expected:

- `v1-fcfs` and `v1-priority` (the plug-in observing, vLLM deciding) fail exactly the
  tests stock vLLM fails here;
- `relstream` fails those and exactly the tests listed in docs/architecture/engine.md,
  section "vLLM's scheduler tests", each with its reason.

A new failure, a listed test that now passes, a listed test that no longer exists, a
different set of tests between runs and a policy's run in which the tests built no
plug-in scheduler of each class all fail the check: the list stays the truth.

    python tests/conformance/check.py OUT docs/architecture/engine.md \
        [stock v1-fcfs v1-priority relstream]
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

SECTION = "vLLM's scheduler tests"
# | `test_scheduler.py::test_name` | all, or `[case]`, `[case]` | reason |
ROW = re.compile(r"^\|\s*`(?P<test>[\w.]+::\w+)`\s*\|(?P<cases>[^|]+)\|(?P<why>[^|]+)\|\s*$")
POLICIES = ("stock", "v1-fcfs", "v1-priority", "relstream")
PREFIX = "tests/v1/core/"
PLUGIN_CLASSES = ("RelstreamScheduler", "RelstreamAsyncScheduler")


def release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def documented(doc: str, vllm: str) -> dict[str, str | tuple[str, ...]]:
    """The section's table for a run on vLLM `vllm`: test (module::function) -> "all"
    or its listed cases. A row marked "(from X.Y)" holds from that release on: vLLM's
    tests it names do not exist in older ones."""
    lines = doc.splitlines()
    heading = next(i for i, line in enumerate(lines) if line.lstrip("#").strip() == SECTION)
    level = len(lines[heading]) - len(lines[heading].lstrip("#"))
    rows: dict[str, str | tuple[str, ...]] = {}
    for line in lines[heading + 1 :]:
        if line.startswith("#") and len(line) - len(line.lstrip("#")) <= level:
            break
        match = ROW.match(line)
        if match:
            cases = match["cases"].strip()
            since = re.search(r"\(from ([\d.]+)\)", cases)
            if since and release(vllm) < release(since[1]):
                continue
            cases = cases.replace(since[0], "").strip() if since else cases
            listed = tuple(re.findall(r"`(\[[^`]+\])`", cases))
            known = rows.get(match["test"], ())
            # A test may take several rows (its cases for different reasons).
            rows[match["test"]] = "all" if "all" in (cases, known) else (*known, *listed)
    return rows


def expected_relstream(rows: dict, collected: set[str]) -> tuple[set[str], list[str]]:
    """The ids the table names among `collected`, and the rows naming none of them."""
    expected, stale = set(), []
    for test, cases in rows.items():
        base = PREFIX + test
        if cases == "all":
            named = {n for n in collected if n == base or n.startswith(base + "[")}
        else:
            named = {base + case for case in cases} & collected
            stale += [f"{test}{case}" for case in cases if base + case not in collected]
        if not named:
            stale.append(test)
        expected |= named
    return expected, stale


def failed(outcomes: dict[str, str]) -> set[str]:
    return {nodeid for nodeid, outcome in outcomes.items() if outcome == "failed"}


def check(out: Path, doc: str, policies: tuple[str, ...]) -> list[str]:
    """What is wrong (empty: every run failed exactly where expected)."""
    runs = {p: json.loads((out / f"{p}.json").read_text())["outcomes"] for p in policies}
    problems = []
    collected = set(runs[policies[0]])
    for policy, outcomes in runs.items():
        if set(outcomes) != collected:
            problems.append(f"{policy}: ran other tests than {policies[0]}")
        built = json.loads((out / f"{policy}.json").read_text()).get("built", {})
        if policy != "stock" and not all(built.get(c) for c in PLUGIN_CLASSES):
            # vLLM's tests build no plug-in (a name they build from moved): the run
            # would test stock vLLM and pass vacuously.
            problems.append(f"{policy}: the tests built no plug-in of each class: {built}")
    reference = failed(runs["stock"]) if "stock" in runs else set()
    vllm = {json.loads((out / f"{p}.json").read_text()).get("vllm", "0") for p in policies}
    if len(vllm) > 1:
        problems.append(f"the runs are of different vLLM releases: {sorted(vllm)}")
    rows = documented(doc, max(vllm, key=release))
    relstream_extra, stale = expected_relstream(rows, collected)
    for row in stale:
        problems.append(f"docs/architecture/engine.md lists {row}, which vLLM's tests do not hold")
    for policy, outcomes in runs.items():
        expected = reference | (relstream_extra if policy == "relstream" else set())
        got = failed(outcomes)
        for nodeid in sorted(got - expected):
            problems.append(f"{policy}: newly fails {nodeid}")
        for nodeid in sorted(expected - got):
            problems.append(f"{policy}: newly passes {nodeid} (update the expected list)")
    return problems


def main(argv: list[str]) -> int:
    out, doc = Path(argv[0]), Path(argv[1]).read_text()
    policies = tuple(argv[2:]) or POLICIES
    problems = check(out, doc, policies)
    runs = {p: json.loads((out / f"{p}.json").read_text())["outcomes"] for p in policies}
    for policy, outcomes in runs.items():
        print(f"{policy}: {len(outcomes)} run, {len(failed(outcomes))} failed")
    for problem in problems:
        print(problem)
    if problems:
        print(f"against {SECTION!r} in docs/architecture/engine.md: {len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
