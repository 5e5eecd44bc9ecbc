"""How much of the KV running rows are expected to still need admission keeps back: a
share that decays while steps run without preempting and springs back when one must
preempt (SGLang's `new_token_ratio`, applied to relstream's expected outputs).

Keeping all of it, every running row's expected output (its siblings' mean, or its
whole budget before one finished), admitted a fraction of the batch stock V1 runs where
KV binds and outputs are long: 2 of 12 rows with 480-token budgets in 1,024 tokens, a
makespan 15 % over stock V1's and a mean up to 1.6x its on OPT-13B/A100 with 256-512-token
answers. A GPU step costs mostly its base, so a full batch pays for the recomputation
of what it must then preempt; a CPU step grows with its batch, and there the Δ gate
holds admissions before KV binds. So the share falls to nothing over `DECAY_STEPS`
steps that preempt nothing, and a step that preempts says the engine is short: back to
all of it (docs/benchmarks/sim-kv-bound/).
"""

from __future__ import annotations

from dataclasses import dataclass

INITIAL = 1.0  # all of it, as before any step proved less safe
LOWEST = 0.0  # the share it decays to
DECAY_STEPS = 100  # steps without a preemption from INITIAL to LOWEST


@dataclass
class ReserveShare:
    """The share of running rows' expected future KV kept back (`StepAdmission.reserve`)."""

    value: float = INITIAL

    def stepped(self, preempted: bool) -> None:
        """After a planned step: back to `INITIAL` if it preempted, else one decay down."""
        if preempted:
            self.value = INITIAL
        else:
            self.value = max(LOWEST, self.value - (INITIAL - LOWEST) / DECAY_STEPS)
