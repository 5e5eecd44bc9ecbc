"""The KV kept for running rows' expected outputs: a share that decays and springs back."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import CostModel, Linear
from relstream.scheduler.admission import StepAdmission, Stop
from relstream.scheduler.data import EngineLimits
from relstream.scheduler.relstream_policy import Relstream
from relstream.scheduler.reserve import DECAY_STEPS, ReserveShare


def test_the_share_decays_over_quiet_steps_and_springs_back_on_a_preemption():
    share = ReserveShare()
    assert share.value == 1.0
    for _ in range(DECAY_STEPS // 2):
        share.stepped(preempted=False)
    assert share.value == pytest.approx(0.5)
    for _ in range(DECAY_STEPS):
        share.stepped(preempted=False)
    assert share.value == 0.0
    share.stepped(preempted=True)
    assert share.value == 1.0


def kv_bound() -> ScriptedView:
    """1,024 tokens of KV (64 blocks of 16); 12 rows of 16-token prompts, 480 tokens of
    budget each."""
    view = ScriptedView(EngineLimits(16, 1000, 1024, 16))  # the free KV given to each step
    view.add_relquery("a", [16] * 12, max_tokens=480)
    return view


@pytest.mark.parametrize(("share", "admitted"), [(1.0, 2), (0.5, 4), (0.0, 12)])
def test_running_rows_keep_their_share_of_the_kv_they_are_expected_to_need(share, admitted):
    # A row takes 1 block now and keeps share × 30 blocks (its 480 tokens) for later:
    # 1.0: 16 + 480 each, 2 fit in 1,024; 0.5: 16 + 240 each, 4 fit; 0: 16 each, all 12.
    view = kv_bound()
    step = StepAdmission.for_step(view, free_kv=1024, reserve=share)
    stop = step.admit(list(view.tracker.waiting.values()))
    assert len(step.admitted) == admitted
    assert stop is (Stop.KV if admitted < 12 else Stop.DRAINED)


def test_relstream_fills_a_kv_bound_batch_once_steps_stop_preempting():
    # The policy's own steps: the share starts whole (2 of 12 rows fit beside what they
    # will need) and after 100 steps that preempted nothing it keeps none.
    policy = Relstream(CostModel(Linear(0.001, 0.02), Linear(0.002, 0.02)))
    assert policy.reserve_share.value == 1.0
    for _ in range(DECAY_STEPS):
        policy.reserve_share.stepped(preempted=False)
    view = kv_bound()
    step = StepAdmission.for_step(view, free_kv=1024, reserve=policy.reserve_share.value)
    assert step.admit(list(view.tracker.waiting.values())) is Stop.DRAINED
