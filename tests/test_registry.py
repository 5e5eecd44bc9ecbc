import pytest

from relstream.scheduler import POLICIES, VllmQueue, make_policy, policy_spec, static_priority


def test_stock_vllm_decides_its_own_policies_and_the_plug_in_decides_the_rest(cost):
    assert policy_spec("v1-fcfs").decided_by_vllm is VllmQueue.FCFS
    assert policy_spec("v1-priority").decided_by_vllm is VllmQueue.PRIORITY
    plug_in = [name for name, spec in POLICIES.items() if spec.decided_by_vllm is None]
    assert plug_in == [
        "v0-fcfs",
        "v0-sp",
        "v0-sp-evict",
        "sarathi",
        "relserve",
        "relserve-pp",
        "relserve-dp",
        "relstream",
    ]
    # Policies the plug-in decides keep vLLM's plain FCFS queue underneath.
    assert {policy_spec(name).vllm_queue for name in plug_in} == {VllmQueue.FCFS}
    assert all(make_policy(name, cost).name == name for name in POLICIES)


def test_static_priority_is_prompt_tokens_plus_the_output_budget():
    # Three rows of 100, 120 and 80 prompt tokens, 5 output tokens each: 300 + 3 × 5.
    assert static_priority(prompt_tokens=300, requests=3, max_tokens=5) == 315


def test_unknown_policies_are_named_with_the_known_ones():
    known = r"unknown policy 'lifo'; choose one of: v1-fcfs, v1-priority"
    with pytest.raises(ValueError, match=known):
        policy_spec("lifo")
