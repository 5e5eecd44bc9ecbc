"""Priority classes: a relQuery of a higher class goes first, and takes the seats of a
lower class's running rows (docs/priority.md).

A relQuery's `priority` (higher first; 0 unless its user or registration says, a
backfill below) leads its rank (`ranking`), so admission walks classes in order, and the
starvation guard and the deadlines act within a class. Order alone is not enough once
the engine is full: a lower class's rows hold every seat or the KV, and a waiting
higher-class relQuery would wait until they finish (vLLM's #40004, where a waiting
high-priority request cannot preempt running ones at `max_num_seqs`). So in a step where
the best-ranked relQuery with waiting rows outranks running rows of a lower class and
the step cannot seat its next `MAKE_WAY_ROWS` rows, that many of the worst-ranked
lower-class rows at most are preempted (by recompute, as vLLM preempts); they rejoin the
waiting queue in their class's order. vLLM admits none in a step that preempts, so the
higher class's rows are admitted the step after: a relQuery of m rows has every row
seated within 2·⌈m / MAKE_WAY_ROWS⌉ steps of becoming the best-ranked waiting one.

Seated, a higher class must also not be slowed by the lower rows decoding beside it.
While the top class present has rows running, a step decodes lower-class relQueries
(best first, whole) only while their decodes keep the step within SLOWDOWN of the top
class's own step at the fitted prices (`within_slowdown`); the others keep their KV
and seats and wait (vLLM does not see them that step). Where a step's base dominates
(a GPU) nearly every lower row still rides along; where each decode costs (a CPU) few
do. Once no higher class runs, every row runs again.

A step cannot be cut short, so a higher class arriving also waits for the step in
flight. A class below 0 is background: while nothing of class 0 or above is present, a
step's token budget is cut to what keeps it within BACKGROUND_STEP_S at the fitted
prices (at least BACKGROUND_MIN_TOKENS of prompt; prompts are chunked to it), so a live
arrival waits at most about that. Where a full chunk costs less (a GPU) this does not
bind; on a CPU it costs the backfill a step's base per extra step (docs/priority.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass

from relstream.scheduler.admission import StepAdmission
from relstream.scheduler.data import RelQueryInfo
from relstream.scheduler.paperlines import Coefficients

MAKE_WAY_ROWS = 8  # lower-class rows one step may preempt for a higher class
SLOWDOWN = 1.2  # a step with lower-class decodes: at most this times the top class's own
BACKGROUND = 0  # classes below this are background
BACKGROUND_STEP_S = 0.45  # a background step's cost at the fitted prices, at most
BACKGROUND_MIN_TOKENS = 128  # prompt tokens a background step may always take


def best_waiting(ranked: Iterable[tuple[tuple, RelQueryInfo]]) -> RelQueryInfo | None:
    """The best-ranked relQuery with waiting rows among `ranked` (each best first, as
    `heapq.merge` of started and waiting relQueries gives them)."""
    return next((info for _, info in ranked if info.waiting), None)


def make_way(step: StepAdmission, waiting: RelQueryInfo | None) -> int:
    """Preempt lower-class running rows (those the step does not run first) so that
    `waiting`'s next rows would be admitted; none where nothing runs below its class,
    or they fit already. The rows preempted."""
    victim = step.last_victim()
    if waiting is None or victim is None or victim.priority >= waiting.priority:
        return 0  # nothing below its class runs: every step of one class stops here
    rows = list(itertools.islice(waiting.waiting.values(), MAKE_WAY_ROWS))
    kv = sum(step.admission_need(seq) for seq in rows) + step.view.limits.watermark_kv_tokens
    taken = 0
    while taken < MAKE_WAY_ROWS:
        victim = step.last_victim()
        if victim is None or victim.priority >= waiting.priority:
            break
        if step.seats >= len(rows) and step.free_kv - step.reserved >= kv:
            break
        step.preempt_last()
        taken += 1
    return taken


def lowest_running(started: Iterable[tuple[tuple, RelQueryInfo]]) -> int | None:
    """The lowest class among the running relQueries (None: none runs)."""
    return min((info.priority for _, info in started), default=None)


def outranks(info: RelQueryInfo, lowest: int | None) -> bool:
    """Whether `info` is of a class above a running relQuery's: the Δ gate, which holds
    work back so the running batch finishes sooner, never holds it for a lower class."""
    return lowest is not None and info.priority > lowest


@dataclass(frozen=True)
class Slowdown:
    """What lower classes may add to a step beside the top class running: `decoding`
    running relQueries of `active` decode, and waiting lower-class prompts may take
    `allowance` engine seconds more (None: no class above another runs). `budget`: the
    step's token budget where every class present is background (None: the engine's)."""

    decoding: int
    top: int = 0
    allowance: float | None = None
    budget: int | None = None

    def prompt_limit(self, info: RelQueryInfo, per_token: float) -> int | None:
        """The prompt tokens lower-class relQueries may compute this step, together
        (None: any; `info` is of the top class, or nothing is above another)."""
        if self.allowance is None or info.priority >= self.top or per_token <= 0:
            return None
        return int(self.allowance / per_token)


def within_slowdown(
    active: list[RelQueryInfo], c: Coefficients, budget: int, waiting: RelQueryInfo | None
) -> Slowdown:
    """What a step runs of `active` (running relQueries, best first, so by class): all
    of the top class, then lower ones while their decodes cost at most (SLOWDOWN − 1) of
    the top class's step (its base, decodes and prompt chunks, within the token
    `budget`); what is left of that allowance goes to lower-class prompts. Where the
    top class only waits (`waiting`, the best-ranked relQuery with waiting rows), its
    step is a step's base: the steps that seat it stay short."""
    classes = [info.priority for info in active[:1]]
    top = max([*classes, waiting.priority] if waiting is not None else classes, default=None)
    if top is None:
        return Slowdown(0)
    count = sum(1 for info in active if info.priority == top)
    decodes = prompt = 0
    for info in active[:count]:
        decodes += len(info.running) - len(info.prompting)
        prompt += sum(seq.uncomputed_tokens for seq in info.prompting.values())
    own = c.base + c.per_decode * decodes + c.per_token * min(prompt, budget)
    allowance = (SLOWDOWN - 1) * own
    for info in active[count:]:
        cost = c.per_decode * len(info.running)
        if cost > allowance:
            break
        allowance -= cost
        count += 1
    cut = background(active[:count], c, budget) if top < BACKGROUND else None
    return Slowdown(count, top, allowance if active else None, cut)


def background(decoding: list[RelQueryInfo], c: Coefficients, budget: int) -> int:
    """The token budget (of the engine's `budget`) of a step where every class present
    is background and `decoding` decode: their decodes, and prompt tokens that keep the
    step within BACKGROUND_STEP_S at the fitted prices, at least BACKGROUND_MIN_TOKENS.
    Among background classes the slowdown acts as among any others."""
    decodes = sum(len(info.running) - len(info.prompting) for info in decoding)
    allowance = BACKGROUND_STEP_S - c.base - c.per_decode * decodes
    prompt = int(allowance / c.per_token + 1e-6) if c.per_token > 0 else budget
    return min(decodes + max(prompt, BACKGROUND_MIN_TOKENS), budget)
