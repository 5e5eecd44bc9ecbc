"""How much of an unproven row's output budget admission keeps KV for: a share that
decays while steps run without preempting and springs back when one must preempt
(SGLang's `new_token_ratio`).

Before any row of a relQuery has finished, nothing says where its rows' outputs end, and
keeping KV for every running row's whole budget admits a fraction of the batch stock
V1 runs where KV binds (a 512-token budget whose outputs end at 256-512: 2 of 12
admitted). Keeping a share of it, lowered step by step while the guess proves safe,
fills the batch; a step that had to preempt says the guess was short, and the share goes
back up to the whole budget. Rows whose relQuery has finished rows are reserved at that
evidence (`remaining.expected_output`), in full. The decay was chosen on a KV-bound
profile with 256-512-token outputs, where SGLang's own (0.7 down to 0.1 over 600 steps)
kept relstream's makespan 11 % over stock V1's (docs/benchmarks/sim-kv-bound/).
"""

from __future__ import annotations

from dataclasses import dataclass

INITIAL = 1.0  # the whole budget, as before any step proved a lower guess safe
LOWEST = 0.0  # the share it decays to
DECAY_STEPS = 100  # steps without a preemption from INITIAL to LOWEST


@dataclass
class ReserveShare:
    """The share of an unproven row's remaining budget kept in KV (`StepAdmission.guess`)."""

    value: float = INITIAL

    def stepped(self, preempted: bool) -> None:
        """After a planned step: back to `INITIAL` if it preempted, else one decay down."""
        if preempted:
            self.value = max(self.value, INITIAL)
        else:
            self.value = max(LOWEST, self.value - (INITIAL - LOWEST) / DECAY_STEPS)
