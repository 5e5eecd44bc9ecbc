"""A campaign spans machines: epochs, cells, and which runs a report compares."""

import json

import msgspec
import pytest

from relstream.scheduler.admission import Stop
from relstream.scheduler.data import StepFeedback, StepKind
from relstream.scheduler.steprecord import StepLogStart, StepRecord, encode_line, read_step_log
from relstream_lab.campaign.checkpoint import (
    Checkpoint,
    compress_step_log,
    discard_step_log,
    matching_epoch,
    reported_runs,
    warm_up_speeds,
)
from relstream_lab.common.workload import TraceConfig

POLICIES = ("relstream", "v1-fcfs")
SEED_2 = TraceConfig(48, 1, 48, "poisson", 1.0, 0.02, 2)


def run(policy: str, load: float, epoch: int | None, mean: float, **extra) -> dict:
    record = {"policy": policy, "arrival": "poisson", "seed": 2, "rate": load, "mean": mean}
    if epoch is not None:  # records from before epochs carry none: epoch 0
        record["epoch"] = epoch
    return {**record, **extra}


def step(tokens: int, decodes: int) -> StepRecord:
    """A step of a machine whose steps cost 20 ms + 1 ms a prompt token + 2 ms a decode."""
    duration = 0.020 + 0.001 * tokens + 0.002 * decodes
    return StepRecord(
        kind=StepKind.MIXED, uncached_tokens=tokens, decode_requests=decodes, duration_s=duration
    )


def slower(record: StepRecord, factor: float) -> StepRecord:
    return msgspec.structs.replace(record, duration_s=record.duration_s * factor)


CAPACITY_STEPS = [step(t, d) for t in (0, 64, 512) for d in (1, 8, 30)]


def write_capacity_log(path, steps) -> None:
    path.write_text("".join(encode_line(line) for line in (StepLogStart(), *steps)))


def test_a_cell_is_compared_in_the_latest_epoch_that_ran_every_policy():
    runs = [
        run("relstream", 1.3, None, 46.4, superseded="relstream changed"),
        run("v1-fcfs", 1.3, None, 96.5),
        run("relstream", 1.3, 1, 80.0),
        run("v1-fcfs", 1.3, 1, 190.0),
        run("relstream", 0.75, 0, 20.0),
        run("v1-fcfs", 0.75, 0, 30.0),
        run("relstream", 0.75, 1, 41.0),  # epoch 1 has not run v1-fcfs here yet
    ]
    chosen = {(r["rate"], r["policy"]): r["mean"] for r in reported_runs(runs, POLICIES)}
    assert chosen == {
        (1.3, "relstream"): 80.0,
        (1.3, "v1-fcfs"): 190.0,
        (0.75, "relstream"): 20.0,
        (0.75, "v1-fcfs"): 30.0,
    }


def test_an_unfinished_cell_reports_its_latest_epoch_alone():
    runs = [run("v1-fcfs", 1.3, None, 96.5), run("relstream", 1.3, 1, 80.0)]
    assert [r["mean"] for r in reported_runs(runs, POLICIES)] == [80.0]


def test_a_superseded_run_leaves_its_cell_to_be_run_again(tmp_path):
    checkpoint = Checkpoint(tmp_path, resume=True)
    checkpoint.add_runs(
        [
            run("relstream", 1.3, None, 46.4, superseded="relstream changed"),
            run("v1-fcfs", 1.3, 0, 96.5),
        ]
    )
    assert not checkpoint.cell_done(SEED_2, 1.3, POLICIES)
    assert checkpoint.has_run("v1-fcfs", SEED_2, 1.3, 0)
    assert not checkpoint.has_run("v1-fcfs", SEED_2, 1.3, 1)
    checkpoint.add_runs([run("relstream", 1.3, 1, 80.0), run("v1-fcfs", 1.3, 1, 190.0)])
    assert checkpoint.cell_done(SEED_2, 1.3, POLICIES)


def test_epochs_are_numbered_in_order_and_keep_the_first_capacity_trace(tmp_path):
    checkpoint = Checkpoint(tmp_path, resume=True)
    seed_0 = TraceConfig(48, 1, 48, "poisson", 1.0, 0.02, 0)
    assert checkpoint.capacity_trace(SEED_2) == SEED_2  # no epoch yet: the first trace
    first = checkpoint.save_epoch(0.2, seed_0, "fast", {})
    second = checkpoint.save_epoch(0.1, SEED_2, "slow", {0: 2.0})
    assert (first.number, first.capacity_log.name) == (0, "steps-capacity.jsonl")
    assert (second.number, second.capacity_log.name) == (1, "steps-capacity-e1.jsonl")
    assert [(e.capacity, e.machine) for e in checkpoint.epochs()] == [(0.2, "fast"), (0.1, "slow")]
    assert checkpoint.capacity_trace(SEED_2) == seed_0
    second_record = json.loads((tmp_path / "capacity-e1.json").read_text())
    assert second_record["warm_up_speed_vs_epochs"] == {"0": 2.0}  # why it is an epoch


def test_a_machine_joins_the_epoch_whose_speed_it_matches(tmp_path):
    checkpoint = Checkpoint(tmp_path, resume=True)
    fast = checkpoint.save_epoch(0.2, SEED_2, "fast", {})
    write_capacity_log(fast.capacity_log, CAPACITY_STEPS)
    warm_up = [step(128, 0), step(0, 2), step(0, 2)]

    def joined(epochs, factor):
        steps = [slower(s, factor) for s in warm_up]
        return matching_epoch(epochs, warm_up_speeds(epochs, steps))

    assert warm_up_speeds([fast], warm_up) == {0: pytest.approx(1.0)}
    assert joined([fast], 1.0) == fast
    assert joined([fast], 1.3) == fast  # within 1.4x
    assert joined([fast], 2.0) is None
    slow = checkpoint.save_epoch(0.1, SEED_2, "slow", {0: 2.0})
    write_capacity_log(slow.capacity_log, [slower(s, 2.0) for s in CAPACITY_STEPS])
    assert joined([fast, slow], 2.0) == slow


def test_a_finished_run_s_step_log_is_compressed_and_reads_back_the_same(tmp_path):
    log = tmp_path / "steps-relstream-poisson-s2-1.3-e0.jsonl"
    header = StepLogStart(policy="relstream", limits={"max_num_seqs": 256})
    log.write_text("".join(encode_line(line) for line in (header, *CAPACITY_STEPS)))
    size = log.stat().st_size
    kept = compress_step_log(log)
    assert kept.name == "steps-relstream-poisson-s2-1.3-e0.jsonl.gz"
    assert not log.exists() and kept.stat().st_size < size
    assert read_step_log(log) == (header, CAPACITY_STEPS)  # by its plain name
    assert read_step_log(kept) == (header, CAPACITY_STEPS)  # or its own
    discard_step_log(log)  # a fresh attempt at the same run starts from nothing
    assert list(tmp_path.iterdir()) == []


def test_a_new_campaign_clears_compressed_step_logs_too(tmp_path):
    write_capacity_log(tmp_path / "steps-capacity.jsonl", CAPACITY_STEPS)
    compress_step_log(tmp_path / "steps-capacity.jsonl")
    Checkpoint(tmp_path, resume=True)
    assert (tmp_path / "steps-capacity.jsonl.gz").exists()
    Checkpoint(tmp_path, resume=False)
    assert list(tmp_path.iterdir()) == []


def test_a_step_line_reads_back_typed_and_writes_the_same_json(tmp_path):
    # A line as the plug-in wrote it before the record was typed: kind and stop as strings.
    line = (
        '{"kind":"decode","uncached_tokens":0,"decode_requests":3,"prefill_requests":0,'
        '"decode_context_tokens":90,"prefill_context_tokens":0,"duration_s":0.05,'
        '"decision_s":0.001,"adapter_s":0.0,"admitted":[],"waiting":2,"running":3,'
        '"t":7.0,"decision":{"stop":"budget"}}'
    )
    log = tmp_path / "steps.jsonl"
    log.write_text(line + "\n")
    _, [step] = read_step_log(log)
    assert step.kind is StepKind.DECODE and step.decision.stop is Stop.BUDGET
    # It writes back the same, and the fields added since at their defaults.
    assert json.loads(encode_line(step)) == {**json.loads(line), "held": 0}
    # What the cost fit learns from it: 3 decodes over 90 context tokens in 0.05 s.
    assert step.feedback(0.05) == StepFeedback(StepKind.DECODE, 0, 3, 0.05, 90)
