"""The KV kept for unproven rows' budgets: a share that decays and springs back."""

import pytest
from helpers import ScriptedView

from relstream.scheduler import EngineLimits
from relstream.scheduler.admission import StepAdmission, Stop
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


@pytest.mark.parametrize(("guess", "admitted"), [(1.0, 2), (0.5, 4), (0.0, 12)])
def test_an_unproven_row_keeps_its_share_of_its_budget(guess, admitted):
    # A row takes 1 block now and keeps guess × 30 blocks (its 480 tokens) for later:
    # 1.0: 16 + 480 each, 2 fit in 1,024; 0.5: 16 + 240 each, 4 fit; 0: 16 each, all 12.
    view = kv_bound()
    step = StepAdmission.for_step(view, free_kv=1024, reserve=1.0, guess=guess)
    stop = step.admit(list(view.tracker.waiting.values()))
    assert len(step.admitted) == admitted
    assert stop is (Stop.KV if admitted < 12 else Stop.DRAINED)


def test_a_proven_row_is_reserved_at_its_siblings_outputs_whatever_the_share():
    # Row a#0 finished after 40 tokens: every other row takes 1 block now and keeps 3 for
    # its 40 tokens, 64 tokens a row, so all 11 fit in 1,024 whatever the unproven share.
    for guess in (1.0, 0.0):
        view = kv_bound()
        view.start("a#0")
        view.tracker.record_progress(view.tracker.running["a#0"], generated=39)
        view.tracker.finish("a#0")
        step = StepAdmission.for_step(view, free_kv=1024, reserve=1.0, guess=guess)
        assert step.admit(list(view.tracker.waiting.values())) is Stop.DRAINED
        assert len(step.admitted) == 11
