"""An engine's load on its way out of vLLM's engine core: what every policy reports
(`Policy.load`, on views computed by hand) and the file the plug-in writes it to
(`engine/core/loadwriter.py`) and the runtime reads it from (`engine/tags.py`)."""

import time

import pytest
from helpers import ScriptedView

from relstream.engine.core.loadwriter import MAX_SHARE, WRITE_EVERY_S, LoadWriter
from relstream.engine.tags import read_load
from relstream.placement.load import Load
from relstream.scheduler import CostModel, Linear
from relstream.scheduler.data import EngineLimits
from relstream.scheduler.registry import make_policy

# 1 ms a prompt token; a decode step 30 ms plus 2 ms a request.
COST = CostModel(prefill=Linear(0.001, 0.02), decode=Linear(0.002, 0.03))
LIMITS = EngineLimits(
    max_num_seqs=8, max_num_batched_tokens=512, kv_capacity_tokens=10**6, block_size=16
)


@pytest.mark.parametrize("policy", ["v1-fcfs", "relstream"])
def test_a_policy_reports_what_is_left_at_its_prices(policy):
    view = ScriptedView(LIMITS)
    view.add_relquery("A", [100, 200], max_tokens=10)
    # Nothing ran: prompts 300 tokens, outputs 2 x 10, each decode step's base shared by
    # the two rows the backlog will run together (per output 0.002 + 0.03 / 2 = 0.017 s):
    # 0.3 + 0.34 s. Relstream has planned no step yet, so it prices with the cost model's
    # lines as every policy does.
    load = make_policy(policy, COST).load(view)
    assert (load.per_prompt_token_s, load.per_output_token_s) == pytest.approx((0.001, 0.017))
    assert load.outstanding_s == pytest.approx(0.64)


def test_a_running_row_counts_only_what_it_has_left():
    view = ScriptedView(LIMITS)
    view.add_relquery("A", [100, 200], max_tokens=10)
    view.add_relquery("B", [50], max_tokens=4)
    view.start("A#0")  # its prompt computed and one token out: 9 tokens left
    view.start("B#0")  # 3 left
    # Three requests held, so a batch of three: per output 0.002 + 0.03 / 3 = 0.012 s.
    # Left: A#1's prompt (200) and 9 + 10 + 3 output tokens: 0.2 + 22 x 0.012 = 0.464 s.
    load = make_policy("v1-fcfs", COST).load(view)
    assert load.per_output_token_s == pytest.approx(0.012)
    assert load.outstanding_s == pytest.approx(0.464)


@pytest.mark.parametrize("policy", ["v1-fcfs", "relstream"])
def test_a_policy_counts_its_relqueries_by_the_size_class_of_what_each_has_left(policy):
    view = ScriptedView(LIMITS)
    view.add_relquery("A", [100, 200], max_tokens=10)
    view.add_relquery("B", [50], max_tokens=4)
    view.start("A#0")
    view.start("B#0")
    # As priced above: A 0.2 + 19 x 0.012 = 0.428 s (class 6: 1/4 to 1/2 s), B 3 x 0.012
    # = 0.036 s (class 3: 1/32 to 1/16 s).
    assert make_policy(policy, COST).load(view).size_counts == (0, 0, 0, 1, 0, 0, 1)


def test_a_backlog_is_priced_at_the_engines_seats_not_beyond():
    view = ScriptedView(LIMITS)
    view.add_relquery("A", [10] * 20, max_tokens=5)
    # 20 rows wait, 8 seats: per output 0.002 + 0.03 / 8 = 0.00575 s; 200 prompt tokens
    # and 100 output tokens: 0.2 + 0.575 s.
    load = make_policy("v1-fcfs", COST).load(view)
    assert load.per_output_token_s == pytest.approx(0.00575)
    assert load.outstanding_s == pytest.approx(0.775)


def test_the_runtime_reads_what_the_plugin_wrote(tmp_path):
    path = tmp_path / "load.json"
    assert read_load(path) is None  # nothing written yet: nothing to report
    before = time.monotonic()
    assert LoadWriter(path).write(Load(1.5, 0.001, 0.017, size_counts=(0, 2, 1)))
    at, written = read_load(path)
    assert written == Load(1.5, 0.001, 0.017, size_counts=(0, 2, 1))
    assert before <= at <= time.monotonic()
    path.write_bytes(b'[1.0, {"outstanding_s": ')  # not ours, or cut: read as nothing
    assert read_load(path) is None


def test_writes_come_every_period_and_at_once_when_work_runs_out(tmp_path):
    writer = LoadWriter(tmp_path / "load.json")
    assert writer.due(time.monotonic(), idle=False)  # never written
    writer.write(Load(2.0, 0.001, 0.017))
    now = time.monotonic()
    assert not writer.due(now, idle=False)
    assert writer.due(now + WRITE_EVERY_S, idle=False)
    assert writer.due(now, idle=True)  # the last request gone: write the zero now
    writer.write(Load(0.0, 0.001, 0.017))
    assert not writer.due(time.monotonic(), idle=True)  # and only once


def test_an_idle_engine_core_writes_no_work_and_its_prices(tmp_path):
    # The last request gone, a policy may still price what its book holds: written as
    # none, so the engine reads as idle at once; its prices stay for the placer.
    writer = LoadWriter(tmp_path / "load.json")
    writer.write(Load(2.0, 0.001, 0.017, size_counts=(0, 1)), idle=True)
    assert read_load(writer.path)[1] == Load(0.0, 0.001, 0.017)


def test_a_load_slow_to_price_is_written_less_often(tmp_path):
    writer = LoadWriter(tmp_path / "load.json")
    writer.write(Load(2.0, 0.001, 0.017), took_s=0.04)  # 40 ms: 10,000 one-row relQueries
    now = time.monotonic()
    assert not writer.due(now + WRITE_EVERY_S, idle=False)
    assert writer.due(now + 0.04 / MAX_SHARE, idle=False)  # 0.8 s: 5 % of the thread


def test_a_load_that_cannot_be_written_fails_nothing(tmp_path):
    writer = LoadWriter(tmp_path / "gone" / "load.json")  # its folder removed at shutdown
    assert writer.write(Load(1.0, 0.001, 0.017)) is False
    assert read_load(writer.path) is None
