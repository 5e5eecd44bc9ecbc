"""The stock vLLM V1 model on scripted cases whose steps are worked out by hand from V1's
rules (running first under the token budget, chunked prompts, admission only when the
whole sequence fits and nothing was preempted, the last running request preempted)."""

from relstream.scheduler import make_policy
from relstream.scheduler.data import EngineLimits, PrefillChunk, StepKind
from relstream.sim.kvcache import block_hashes
from relstream.sim.profiles import LinearProfile
from relstream.sim.simulator import SimRelQuery, SimRequest, Simulator


def engine(policy: str, budget: int, kv_tokens: int, seats: int = 8) -> Simulator:
    limits = EngineLimits(
        max_num_seqs=seats,
        max_num_batched_tokens=budget,
        kv_capacity_tokens=kv_tokens,
        block_size=4,
    )
    profile = LinearProfile("tiny", limits, 0.001, 0.01, 0.001, 0.01)
    return Simulator(profile, make_policy(policy, profile.prior()))


def relquery(name: str, prompts: list[int], max_tokens: int, outputs: int, first_token: int):
    """Prompts of distinct token ids (no prefix sharing), each ending after `outputs`."""
    requests = []
    for row, length in enumerate(prompts):
        ids = list(range(first_token + 1000 * row, first_token + 1000 * row + length))
        requests.append(SimRequest(f"{name}#{row}", length, block_hashes(ids, 4), outputs))
    return SimRelQuery(name, 0.0, max_tokens, requests)


def step(sim: Simulator):
    plan = sim.policy.plan(sim)
    sim.execute(plan)
    return plan


def test_prompts_are_chunked_to_the_budget_and_mixed_into_decode_steps():
    sim = engine("v1-fcfs", budget=8, kv_tokens=64)
    sim.admit(relquery("A", [6, 6], max_tokens=3, outputs=3, first_token=0))
    # Step 1: nothing runs; A#0 takes 6 tokens, A#1 the 2 left of the budget.
    plan = step(sim)
    assert plan.prefill == (PrefillChunk("A#0", 6), PrefillChunk("A#1", 2)) and not plan.decode
    # Step 2: running first: A#0 decodes (1 token), A#1 finishes its prompt (4 tokens).
    plan = step(sim)
    assert plan.decode == ("A#0",) and plan.prefill == (PrefillChunk("A#1", 4),)
    assert plan.kind is StepKind.MIXED
    # A#1 sampled its first token in the step that finished its prompt: both decode now.
    assert step(sim).decode == ("A#0", "A#1")


def test_a_full_cache_preempts_the_last_running_request_and_admits_nobody():
    # 16 KV tokens = 4 blocks of 4. Two prompts of 7 take 2 blocks each.
    sim = engine("v1-fcfs", budget=16, kv_tokens=16)
    sim.admit(relquery("A", [7, 7], max_tokens=6, outputs=6, first_token=0))
    sim.admit(relquery("B", [3], max_tokens=2, outputs=2, first_token=50))
    plan = step(sim)  # both prompts admitted (8 tokens each fit); B does not fit: 0 left
    assert [c.request_id for c in plan.prefill] == ["A#0", "A#1"]
    assert step(sim).decode == ("A#0", "A#1")  # token 8 still fits in 2 blocks
    # Token 9 of A#0 needs a third block; none is free, so the last running request
    # (A#1) is preempted by recompute, and no waiting request is admitted this step.
    plan = step(sim)
    assert plan.preempt == ("A#1",) and plan.decode == ("A#0",) and not plan.prefill
    assert next(iter(sim.tracker.waiting)) == "A#1"  # back at the front of the queue
    # A#1 must recompute 7 + 2 tokens (3 blocks); only 1 block is free: it waits.
    plan = step(sim)
    assert plan.decode == ("A#0",) and not plan.prefill and not plan.preempt


def test_the_priority_queue_admits_the_smaller_static_priority_first():
    # B: 6 prompt tokens + 10 output budget = 16; C: 5 + 2 = 7. One seat.
    for policy, first in (("v1-fcfs", "B#0"), ("v1-priority", "C#0")):
        sim = engine(policy, budget=16, kv_tokens=64, seats=1)
        sim.admit(relquery("B", [6], max_tokens=10, outputs=10, first_token=0))
        sim.admit(relquery("C", [5], max_tokens=2, outputs=2, first_token=100))
        assert [c.request_id for c in step(sim).prefill] == [first], policy


def test_priority_preempts_the_worst_ranked_running_request_fcfs_the_last():
    # KV 16 tokens. B (7 prompt + 5 output budget = 12) runs first; C (7 + 3 = 10, a
    # better rank) arrives after B's prompt. Both fit (2 blocks each). When B's 9th
    # token needs a third block, FCFS evicts the last running request (C) and B decodes;
    # priority evicts the worst-ranked one, B itself, which ends the running pass.
    evicted = {}
    for policy in ("v1-fcfs", "v1-priority"):
        sim = engine(policy, budget=16, kv_tokens=16)
        sim.admit(relquery("B", [7], max_tokens=5, outputs=5, first_token=0))
        assert [c.request_id for c in step(sim).prefill] == ["B#0"]
        late = relquery("C", [7], max_tokens=3, outputs=3, first_token=100)
        late.arrival_time = sim.clock
        sim.admit(late)
        plan = step(sim)  # B decodes (token 8 fits), C is admitted into the 2 free blocks
        assert plan.decode == ("B#0",) and [c.request_id for c in plan.prefill] == ["C#0"]
        evicted[policy] = step(sim)
    assert evicted["v1-fcfs"].preempt == ("C#0",) and evicted["v1-fcfs"].decode == ("B#0",)
    assert evicted["v1-priority"].preempt == ("B#0",)
    assert not evicted["v1-priority"].decode and not evicted["v1-priority"].prefill


def test_a_priority_victim_that_is_the_request_itself_ends_the_pass_only_on_0_32():
    # Block 16, one free block. Running in admission order: hi#0, lo#0, hi#1, each at a
    # block boundary (16 computed tokens, its next token needs a new block). "lo" is the
    # worse by V1's static priority (more rows, longer answers). hi#0 takes the free
    # block; lo#0 finds none and, the worst running request, preempts itself, which
    # frees its one block. 0.32 stops there; 0.33 goes on, and hi#1 fits in that block.
    from helpers import ScriptedView

    def view() -> ScriptedView:
        scripted = ScriptedView(
            EngineLimits(max_num_seqs=8, max_num_batched_tokens=64, kv_capacity_tokens=256,
                         block_size=16)
        )  # fmt: skip
        scripted.add_relquery("hi", [16, 16], max_tokens=4, arrival=0.0)
        scripted.add_relquery("lo", [16, 16, 16], max_tokens=50, arrival=0.0)
        for request_id in ("hi#0", "lo#0", "hi#1"):
            scripted.start(request_id)
        scripted.free_tokens = 16
        return scripted

    cost = LinearProfile("tiny", view().limits, 0.001, 0.01, 0.001, 0.01).prior()
    plans = {
        version: make_policy("v1-priority", cost, vllm_version=version).plan(view())
        for version in ((0, 32), (0, 33))
    }
    assert plans[(0, 32)].decode == ("hi#0",) and plans[(0, 32)].preempt == ("lo#0",)
    assert plans[(0, 33)].decode == ("hi#0", "hi#1") and plans[(0, 33)].preempt == ("lo#0",)
    # FCFS's victim is the last running request: nothing runs after it either way.
    fcfs = [make_policy("v1-fcfs", cost, vllm_version=v).plan(view()) for v in ((0, 32), (0, 33))]
    assert fcfs[0] == fcfs[1]
