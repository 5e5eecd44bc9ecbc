"""The plug-in inside vLLM's own scheduler classes, built as vLLM's scheduler tests build
them (a VllmConfig over a local model folder, a KVCacheConfig, no model run) and driven
with fake model-runner outputs: the plain Scheduler one step at a time, the
AsyncScheduler with a second step planned before the first one's output returns, as on
a GPU. It runs against the installed vLLM (0.32) in `make test`, and against 0.33 by
`make test-vllm-next`, which puts 0.33's scheduler ahead on the path."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")

from vllm.lora.request import LoRARequest  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

from relstream.engine import tags  # noqa: E402
from relstream.engine.core import plugin  # noqa: E402
from relstream.engine.core.harness import BLOCK, build_scheduler, fake_output  # noqa: E402
from relstream.engine.weights import model_dir  # noqa: E402
from relstream_lab.policies import RelstreamUngated  # noqa: E402

BUDGET = 64  # prompt tokens a step may compute: one relQuery's prompt at a time


def build(async_scheduling: bool, policy: str, step_log=None, num_blocks: int = 256):
    return build_scheduler(
        policy, model_folder=model_dir("smollm2"), async_scheduling=async_scheduling,
        step_log=step_log, max_num_seqs=8, budget=BUDGET, num_blocks=num_blocks,
    )  # fmt: skip


def add(
    scheduler, request_id: str, relquery: str, size: int, prompt: int, outputs: int,
    share: str | None = None, lora: int = 0, priority: int = 0,
):  # fmt: skip
    init_none_hash(sha256)
    shared = {"share": share} if share else {}  # a test may wrap relquery_tags without it
    if priority:
        shared["priority"] = priority
    extra = tags.relquery_tags(relquery, size, **shared)
    params = SamplingParams(ignore_eos=True, max_tokens=outputs, extra_args=extra)
    params.update_from_generation_config({}, 2)
    scheduler.add_request(
        Request(
            request_id=request_id,
            prompt_token_ids=[3 + sum(map(ord, request_id)) % 500] * prompt,
            sampling_params=params,
            pooling_params=None,
            block_hasher=get_request_block_hasher(BLOCK, sha256),
            lora_request=LoRARequest(f"lora-{lora}", lora, f"/lora/{lora}") if lora else None,
        )
    )


def drive(scheduler, in_flight: int, on_event=lambda event: None) -> list:
    """Run to the end, `in_flight` steps planned before the oldest one's output returns;
    returns each step's SchedulerOutput in order."""
    steps, pending = [], []
    while scheduler.has_unfinished_requests() or pending:
        if scheduler.has_unfinished_requests():
            on_event("schedule")
            pending.append(scheduler.schedule())
            steps.append(pending[-1])
            if len(pending) < in_flight and scheduler.has_unfinished_requests():
                continue
        step = pending.pop(0)
        on_event("output")
        scheduler.update_from_output(step, fake_output(scheduler, step))
        assert len(steps) < 300
    return steps


def record_plans(scheduler) -> list[set[str]]:
    """The requests each plan of the policy names, appended as it plans."""
    planned: list[set[str]] = []
    plan = scheduler.relstream_policy.plan

    def recorded(view):
        step = plan(view)
        planned.append({chunk.request_id for chunk in step.prefill} | set(step.decode))
        return step

    scheduler.relstream_policy.plan = recorded
    return planned


def two_relqueries(scheduler) -> None:
    # A big relQuery first, then a small one: FCFS would give the first steps' budget
    # to the big one's prompts; relstream ranks the small one first.
    for i in range(3):
        add(scheduler, f"big-{i}", "big", 3, prompt=100, outputs=12)
    add(scheduler, "small-0", "small", 1, prompt=30, outputs=3)


@pytest.mark.parametrize("in_flight", [1, 2], ids=["sync", "async"])
def test_the_plan_is_what_vllm_runs_and_the_tracker_follows(in_flight):
    scheduler = build(in_flight == 2, "relstream")
    planned = record_plans(scheduler)
    two_relqueries(scheduler)
    steps = drive(scheduler, in_flight)
    ran = [set(step.num_scheduled_tokens) for step in steps]
    assert ran == planned[: len(ran)]  # vLLM ran exactly each plan, step by step
    assert "small-0" in ran[0]  # the plan's order, not FCFS's
    assert not scheduler.tracker.running and not scheduler.tracker.waiting
    assert not scheduler.requests  # every request finished and freed


@pytest.mark.parametrize("in_flight", [1, 2], ids=["sync", "async"])
def test_each_step_is_timed_from_its_own_start(in_flight, tmp_path, monkeypatch):
    # A clock that moves 1 s per scheduling decision and 3 s per model run: a step
    # planned while the previous one runs starts only when that one's output is back.
    now = [0.0]
    monkeypatch.setattr(plugin, "step_clock", lambda: now[0])

    def advance(event: str) -> None:
        now[0] += 1.0 if event == "schedule" else 3.0

    log = tmp_path / "steps.jsonl"
    scheduler = build(in_flight == 2, "relstream", step_log=log)
    two_relqueries(scheduler)
    drive(scheduler, in_flight, advance)
    header, *records = [json.loads(line) for line in log.read_text().splitlines()]
    assert header["vllm"] == vllm.__version__
    assert header["scheduler"] == plugin.scheduler_class(in_flight == 2).__name__
    durations = [record["duration_s"] for record in records]
    if in_flight == 1:  # planned (1 s), run (3 s), reported: each step its own 3 s
        assert set(durations) == {3.0}
    else:
        # Each step runs from its predecessor's output to its own (3 s, plus the next
        # step's planning it overlaps): the steps tile the run, none counted twice.
        assert max(durations) == 4.0, durations
        assert sum(durations) == now[0] - 1.0  # from the first step's start to the end


def test_the_step_log_says_which_vllm_and_scheduler_ran(tmp_path):
    log = tmp_path / "steps.jsonl"
    build(False, "v1-fcfs", step_log=log)
    header = json.loads(log.read_text().splitlines()[0])
    assert (header["vllm"], header["scheduler"]) == (vllm.__version__, "RelstreamScheduler")
    assert os.path.getsize(log) > 0


def test_the_vllm_asked_for_is_the_one_imported():
    # `make test-vllm-next` puts another release ahead on the path: it must be the one
    # these tests ran against, not the installed one again.
    expected = os.environ.get("RELSTREAM_EXPECT_VLLM")
    if expected is None:
        pytest.skip("the installed vLLM: nothing else was asked for")
    assert vllm.__version__ == expected
    assert vllm.__file__.startswith(os.environ["PYTHONPATH"])


@pytest.mark.parametrize("policy", ["v0-sp-evict", "relstream"])
def test_a_preempted_request_whose_blocks_are_cached_is_placed_again(policy):
    # 9 blocks of 16 for four requests of 30 prompt tokens and 6 outputs: one is
    # preempted, its two prompt blocks left cached but held by nobody. Taking it back,
    # a hit on such a block still takes it from the free pool (vLLM counts it so); a
    # plan that counted those blocks both as hits and as free room asked, every step,
    # for a prefill vLLM could not place: v0-sp-evict stalled there for good.
    # relstream at light load keeps KV for expected outputs and would not preempt here:
    # its full batches (the stream's pressure high) are the path under test.
    scheduler = build(False, policy, num_blocks=9)
    if policy == "relstream":
        scheduler.relstream_policy = RelstreamUngated(scheduler.relstream_policy.cost)
    for i in range(4):
        add(scheduler, str(i), f"q{i}", 1, prompt=30, outputs=6)
    steps = drive(scheduler, 1)
    assert not scheduler.requests and len(steps) < 40
    assert any(step.preempted_req_ids for step in steps)  # the case this is about


def test_a_deadline_rides_in_the_request_to_the_trackers_clock(monkeypatch):
    # The runtime sends the seconds left (relative: no clock is shared between processes);
    # the plug-in puts the deadline on its own clock, 30 s after the request arrived.
    tagged = tags.relquery_tags
    monkeypatch.setattr(tags, "relquery_tags", lambda rq, size: tagged(rq, size, 30.0))
    scheduler = build(False, "relstream")
    add(scheduler, "due#0", "due", 1, 16, 2)
    info = scheduler.tracker.relqueries["due"]
    assert info.deadline == pytest.approx(info.arrival_time + 30.0)
    assert "deadline_in_s" not in tagged("free", 1)[tags.EXTRA_ARGS_KEY]


def test_vllm_resolves_the_plug_in_by_the_path_the_runtime_gives_it_and_by_the_old_one():
    # vLLM imports `scheduler_cls` by its dotted path in the engine core process: the path
    # the runtime gives (`tags.PLUGIN_CLASS`) and the one configurations were written with
    # before the engine core's code moved to engine/core/ (an alias for one release).
    from vllm.utils.import_utils import resolve_obj_by_qualname

    assert resolve_obj_by_qualname(tags.PLUGIN_CLASS) is plugin.relstream_scheduler
    old = resolve_obj_by_qualname("relstream.engine.plugin.relstream_scheduler")
    assert old is plugin.relstream_scheduler


def long_prefills(policy: str | None, prompts: int, share: str | None = None):
    """vLLM's own case: 800-token prompts, `long_prefill_token_threshold` 400, budget
    1,024; the tokens each request computes in the first step."""
    scheduler = build_scheduler(
        policy, model_folder=model_dir("smollm2"), max_num_seqs=8, budget=1024,
        num_blocks=512, max_model_len=2048, long_prefill_token_threshold=400,
    )  # fmt: skip
    for n in range(prompts):
        add(scheduler, f"r{n}", f"q{n}", 1, prompt=800, outputs=4, share=share)
    return dict(scheduler.schedule().num_scheduled_tokens)


@pytest.mark.parametrize("policy", [None, "v1-fcfs", "relstream"], ids=str)
def test_each_prompt_is_cut_at_the_long_prefill_threshold_and_the_budget_filled(policy):
    assert long_prefills(policy, 3) == {"r0": 400, "r1": 400, "r2": 224}


def test_a_request_planned_alone_is_cut_as_vllm_cuts_it_among_the_others():
    # Two identical requests: relstream runs one and holds its twin back, as vLLM's
    # queue holds it; with two requests there, vLLM cuts the prompt at 400, not alone.
    assert long_prefills("relstream", 2, share="same") == {"r0": 400}


def test_vllms_priority_queue_is_refused_under_a_policy_that_orders_requests_itself():
    def built(policy: str):
        return build_scheduler(
            policy, model_folder=model_dir("smollm2"), scheduling_policy="priority"
        )

    with pytest.raises(ValueError, match="'v1-priority'"):
        built("relstream")
    assert built("v1-priority").policy_name == "v1-priority"


def test_a_kv_connector_is_refused_under_a_policy_the_plug_in_decides():
    from vllm.config import KVTransferConfig

    connector = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both")
    with pytest.raises(ValueError, match=r"kv_transfer_config .* policy 'relstream'"):
        build_scheduler(
            "relstream", model_folder=model_dir("smollm2"), kv_transfer_config=connector
        )


@pytest.mark.parametrize("policy", ["relstream", "v1-fcfs"])
def test_streaming_input_is_refused_to_its_client_naming_the_policy_unless_vllm_decides(
    policy, caplog
):
    scheduler = build(False, policy)
    params = SamplingParams(ignore_eos=True, max_tokens=2)
    params.update_from_generation_config({}, 2)
    init_none_hash(sha256)
    session = Request(
        request_id="session", prompt_token_ids=[5] * 20, sampling_params=params,
        pooling_params=None, block_hasher=get_request_block_hasher(BLOCK, sha256),
        resumable=True,
    )  # fmt: skip
    add(scheduler, "row-0", "q", 1, prompt=20, outputs=2)
    scheduler.add_request(session)
    step = scheduler.schedule()
    outputs = scheduler.update_from_output(step, fake_output(scheduler, step))
    told = {o.request_id: o.finish_reason for c in outputs.values() for o in c.outputs}
    if policy == "relstream":  # refused: its client told at the first step, the rest served
        assert "streaming input" in caplog.text and "'relstream'" in caplog.text
        assert "session" not in step.num_scheduled_tokens and "session" not in scheduler.requests
        assert told["session"] == FinishReason.ERROR
        drive(scheduler, in_flight=1)
        assert not scheduler.has_unfinished_requests()
    else:  # vLLM's own session: scheduled
        assert "session" in step.num_scheduled_tokens and told.get("session") is None


@pytest.mark.parametrize("policy", ["relstream", "v1-fcfs"])
def test_max_num_active_seqs_bounds_the_running_set(policy):
    # vLLM admits none past max_num_active_seqs; the plug-in hides unplanned running
    # requests from vLLM's count, so the plan itself must count the limit as its seats.
    scheduler = build_scheduler(
        policy, model_folder=model_dir("smollm2"), max_num_seqs=8, budget=256,
        max_num_active_seqs=3,
    )  # fmt: skip
    assert scheduler.limits.max_num_seqs == 3  # the seats every plan counts
    for i in range(6):
        add(scheduler, f"r-{i}", "q", 6, prompt=20, outputs=30)
    most = 0
    for _ in range(40):
        step = scheduler.schedule()
        most = max(most, len(scheduler.running))
        scheduler.update_from_output(step, fake_output(scheduler, step))
    assert most == 3



@pytest.mark.parametrize("watermark", [0.0, 0.25])
def test_the_plan_keeps_vllms_watermark(watermark):
    # vLLM admits a waiting request beside running ones only if `watermark` of the blocks
    # stay free; a plan blind to it admitted rows vLLM then refused, step after step.
    scheduler = build_scheduler(
        "relstream", model_folder=model_dir("smollm2"), max_num_seqs=8, budget=BUDGET,
        num_blocks=48, watermark=watermark,
    )  # fmt: skip
    assert scheduler.limits.watermark_kv_tokens == int(watermark * 48) * BLOCK
    planned = record_plans(scheduler)
    for i in range(6):
        add(scheduler, f"a-{i}", "a", 6, prompt=100, outputs=30)
    for i in range(3):
        add(scheduler, f"b-{i}", "b", 3, prompt=100, outputs=30)
    ran = [set(step.num_scheduled_tokens) for step in drive(scheduler, in_flight=1)]
    assert ran == planned[: len(ran)]


def test_a_held_request_keeps_its_lora_slot():
    # vLLM 0.33 counts every running request's adapter against max_loras, scheduled this
    # step or not; the plug-in shows vLLM only the planned ones, so a request held while
    # its only output token is in flight (async) must still keep its adapter's slot.
    scheduler = build_scheduler(
        "relstream", model_folder=model_dir("smollm2"), async_scheduling=True,
        max_num_seqs=8, budget=BUDGET, max_loras=1,
    )  # fmt: skip
    add(scheduler, "a", "qa", 1, prompt=8, outputs=1, lora=1)
    first = scheduler.schedule()
    assert first.num_scheduled_tokens == {"a": 8}
    add(scheduler, "b", "qb", 1, prompt=8, outputs=1, lora=2)
    second = scheduler.schedule()  # a's token in flight: a is held, holding lora 1
    assert "b" not in second.num_scheduled_tokens
    for step in (first, second):
        scheduler.update_from_output(step, fake_output(scheduler, step))
    steps = drive(scheduler, in_flight=2)
    assert any("b" in step.num_scheduled_tokens for step in steps)  # b runs after a
    assert not scheduler.has_unfinished_requests()


@pytest.mark.parametrize("in_flight", [1, 2], ids=["sync", "async"])
def test_a_live_relquery_takes_a_backfills_seats_on_vllms_scheduler(in_flight):
    # 4 seats held by a backfill's rows (class -1); a live relQuery (class 0) of 2 rows
    # arrives: the plan preempts 2 backfill rows (vLLM preempts them) and vLLM runs the
    # live rows the step after, where stock vLLM would leave them waiting.
    scheduler = build_scheduler(
        "relstream", model_folder=model_dir("smollm2"), async_scheduling=in_flight == 2,
        max_num_seqs=4, budget=256,
    )  # fmt: skip
    for i in range(4):
        add(scheduler, f"bf-{i}", "backfill", 4, prompt=20, outputs=60, priority=-1)
    pending = []
    for _ in range(4):  # the backfill's prompts run, then it decodes
        pending.append(scheduler.schedule())
        if len(pending) == in_flight:
            step = pending.pop(0)
            scheduler.update_from_output(step, fake_output(scheduler, step))
    assert len(scheduler.running) == 4
    add(scheduler, "live-0", "live", 2, prompt=20, outputs=3)
    add(scheduler, "live-1", "live", 2, prompt=20, outputs=3)
    seen, preempted = [], set()
    for _ in range(4):
        step = scheduler.schedule()
        preempted |= set(step.preempted_req_ids or ())
        seen.append(set(step.num_scheduled_tokens))
        pending.append(step)
        if len(pending) == in_flight:
            done = pending.pop(0)
            scheduler.update_from_output(done, fake_output(scheduler, done))
    assert preempted == {"bf-3", "bf-2"}
    assert any({"live-0", "live-1"} <= ran for ran in seen[:3])


@pytest.mark.parametrize(("fair", "order"), [(None, ["a-0-0@0", "a-0-1@1", "b-0-0@2"]),
                                              ({}, ["a-0-0@0", "b-0-0@2", "a-0-1@1"])])
def test_fair_share_serves_the_query_served_least_on_vllms_scheduler(fair, order):
    # One seat; windows of queries a, a, b (their ids name the query) of one row each,
    # alike. relstream takes them in arrival order; with fair share on, query a's first
    # window's tokens put b, served nothing, before a's second.
    scheduler = build_scheduler(
        "relstream", model_folder=model_dir("smollm2"), max_num_seqs=1, budget=256,
        fair_share=fair,
    )  # fmt: skip
    for relquery in ("a-0-0@0", "a-0-1@1", "b-0-0@2"):  # in arrival order
        add(scheduler, relquery, relquery, 1, prompt=20, outputs=3)
    started = []
    for step in drive(scheduler, 1):
        started += [rid for rid in step.num_scheduled_tokens if rid not in started]
    assert started == order


@pytest.mark.parametrize(("priority", "first_chunk"), [(-1, 310), (0, 1000)])
def test_vllm_chunks_a_background_prompt_to_the_plans_cut_budget(priority, first_chunk):
    # One 1,000-token row alone. At the plug-in's prior prices (a step's base 47 ms, 1.3 ms
    # a prompt token) a background step takes (0.45 − 0.047) / 0.0013 = 310 tokens: the plan
    # cuts the step's budget to that and vLLM chunks the prompt to it (it gave a planned
    # request the whole budget before); class 0 runs the whole prompt.
    scheduler = build_scheduler(
        "relstream", model_folder=model_dir("smollm2"), budget=2048, max_model_len=2048,
        num_blocks=512,
    )  # fmt: skip
    add(scheduler, "bf-0", "backfill", 1, prompt=1000, outputs=2, priority=priority)
    step = scheduler.schedule()
    assert step.num_scheduled_tokens == {"bf-0": first_chunk}
