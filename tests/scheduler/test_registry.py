import subprocess
import sys
from pathlib import Path

import pytest
from helpers import entry_point_folder

import relstream_lab
from relstream.scheduler import POLICIES, VllmQueue, make_policy, policy_spec, static_priority
from relstream.scheduler.registry import PolicySpec, queue_conflict, register
from relstream_lab.baselines import BASELINES
from relstream_lab.policies import SIM_ONLY

REPO = Path(__file__).resolve().parents[2]


def test_stock_vllm_decides_its_own_policies_and_the_plug_in_decides_the_rest(cost):
    assert policy_spec("v1-fcfs").decided_by_vllm is VllmQueue.FCFS
    assert policy_spec("v1-priority").decided_by_vllm is VllmQueue.PRIORITY
    plug_in = {name for name, spec in POLICIES.items() if spec.decided_by_vllm is None}
    # relstream's own, and the paper's baselines the lab (imported here) registered.
    assert plug_in == {
        "relstream",
        "v0-fcfs",
        "v0-sp",
        "v0-sp-evict",
        "sarathi",
        "relserve",
        "relserve-pp",
        "relserve-dp",
    }
    # Policies the plug-in decides keep vLLM's plain FCFS queue underneath.
    assert {policy_spec(name).vllm_queue for name in plug_in} == {VllmQueue.FCFS}
    assert all(make_policy(name, cost).name == name for name in POLICIES)


def test_vllms_priority_queue_conflicts_only_with_a_policy_the_plug_in_decides():
    # Under relstream (or a lab policy) vLLM's priority queue would be silently ignored.
    assert "'v1-priority'" in queue_conflict("relstream", "priority")
    assert queue_conflict("sarathi", "priority") is not None
    assert queue_conflict("relstream", "fcfs") is None
    # Stock vLLM decides these itself: its queue is what runs.
    assert queue_conflict("v1-priority", "priority") is None
    assert queue_conflict("v1-fcfs", "priority") is None


def test_each_policy_class_is_named_as_it_is_registered():
    # `v1-fcfs` is V1Fcfs, `v0-sp-evict` V0SpEvict: the name a user types finds the class.
    classes = {spec.name: spec.build for spec in POLICIES.values()} | SIM_ONLY
    assert {name: policy.__name__.lower() for name, policy in classes.items()} == {
        name: name.replace("-", "") for name in classes
    }


def test_static_priority_is_prompt_tokens_plus_the_output_budget():
    # Three rows of 100, 120 and 80 prompt tokens, 5 output tokens each: 300 + 3 × 5.
    assert static_priority(prompt_tokens=300, requests=3, max_tokens=5) == 315


def test_unknown_policies_are_named_with_the_known_ones():
    known = r"unknown policy 'lifo'; choose one of: v1-fcfs, v1-priority, relstream, "
    with pytest.raises(ValueError, match=known):
        policy_spec("lifo")


def test_a_name_registers_once_and_never_for_another_policy():
    relstream_lab.baselines.register()  # again: the same specs, no error
    assert [policy_spec(p.name).build for p in BASELINES] == list(BASELINES)
    with pytest.raises(ValueError, match="'relserve' is registered already"):
        register(PolicySpec("relserve", BASELINES[0]))


def policy_in_a_fresh_process(name: str, *, lab: bool, entry_point: Path | None) -> str:
    """What a process that has not imported the lab gets for `name`: the spec's class, or
    the error. `lab=False` hides the lab's package; `entry_point` is a folder whose
    dist-info declares the lab's `relstream.policies` entry point, as an install does."""
    code = (
        "import sys\n"
        + ("" if lab else "sys.modules['relstream_lab'] = None\n")
        + "from relstream.scheduler import policy_spec\n"
        f"try: print(policy_spec({name!r}).build.__module__)\n"
        "except ValueError as exc: print(exc)\n"
    )
    path = [str(REPO), *([str(entry_point)] if entry_point else [])]
    env = {"PYTHONPATH": ":".join(path), "PATH": "/usr/bin:/bin"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


@pytest.fixture
def lab_entry_point(tmp_path):
    return entry_point_folder(
        tmp_path, "relstream.policies", "lab", "relstream_lab.baselines:register"
    )


def test_the_engine_finds_a_lab_policy_through_the_entry_point(lab_entry_point):
    found = policy_in_a_fresh_process("relserve", lab=True, entry_point=lab_entry_point)
    assert found == "relstream_lab.baselines.v0"


def test_without_the_lab_a_baseline_names_the_lab_extra(lab_entry_point):
    said = policy_in_a_fresh_process("relserve", lab=False, entry_point=lab_entry_point)
    assert said.startswith("unknown policy 'relserve'; choose one of: v1-fcfs, v1-priority")
    assert "pip install 'relstream[lab]'" in said
    # The product's own need nothing of the lab.
    assert policy_in_a_fresh_process("relstream", lab=False, entry_point=None) == (
        "relstream.scheduler.relstream_policy"
    )
