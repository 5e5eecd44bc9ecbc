"""What is left of a relQuery, estimated the way a real engine can: without knowing where
any row's output will end.

A row is expected to generate as many tokens as the finished rows of its relQuery did on
average (rows of one template tend to answer alike: a label, a digit, a sentence), or
its whole budget OL(R) before any row has finished. A clairvoyant reference passes the
true remaining length of each row instead (`oracle`).

A real engine receives a relQuery's rows one request at a time, so a step may see only
the first few: the rows still on their way count as rows like those seen (their mean
prompt, the expected output), so R is ranked by the size it was submitted with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from relstream.scheduler.data import RelQueryInfo, SeqInfo

Oracle = Callable[[SeqInfo], int]  # a row's true remaining output tokens


@dataclass(frozen=True)
class Remaining:
    rows: int  # requests not finished
    prompt_tokens: int  # prompt (and recomputed output) tokens still to compute
    output_tokens: int  # tokens still to generate, all rows together
    steps: int  # decode steps until its last row ends: L(R)


def expected_output(info: RelQueryInfo) -> int:
    """Tokens one row of R is expected to generate in all (from the rows that ran: a
    row a twin answered generated nothing here)."""
    ran = info.finished - info.twin_answered
    if ran:
        mean = info.finished_output_tokens / ran
        return max(1, min(info.max_tokens, round(mean)))
    return info.max_tokens


def row_remaining_output(seq: SeqInfo, expected: int, oracle: Oracle | None = None) -> int:
    """Tokens a row still generates: the oracle's answer when there is one, else at least
    one while it runs, never past its budget."""
    if oracle is not None:
        return oracle(seq)
    return max(1, min(seq.max_tokens, expected) - seq.output_tokens)


def remaining(info: RelQueryInfo, oracle: Oracle | None = None) -> Remaining:
    """What is left of R. Waiting rows that never ran are taken from the tracker's sums
    (`RelQueryInfo.fresh_*`), so the cost is the rows running or resumed, at most the
    engine's seats, however many wait; with an oracle every row is visited."""
    expected = expected_output(info)
    if oracle is None:
        prompt, outputs, steps = _fresh(info, expected)
        prompting = (
            info.prompting.values(),
            (seq for seq in info.resumed.values() if not seq.prefill_done),
        )
        outputs, steps = _running_outputs(info, expected, outputs, steps)
    else:
        prompt = outputs = steps = 0
        prompting = (
            (seq for seq in info.running.values() if not seq.prefill_done),
            (seq for seq in info.waiting.values() if not seq.prefill_done),
        )
        for rows in (info.running.values(), info.waiting.values()):
            for seq in rows:
                left = oracle(seq)
                outputs += left
                steps = max(steps, left)
    for rows in prompting:  # rows not decoding yet (not `prefill_done`): their prompt
        prompt += sum(seq.prompt_tokens + seq.output_tokens - seq.computed_tokens for seq in rows)
    present = len(info.running) + len(info.waiting) + len(info.held)  # held: no work of R's
    arriving = max(info.total_requests - info.finished - present, 0)
    if arriving:
        prompt += arriving * info.prompt_tokens_seen // max(info.finished + present, 1)
        outputs += arriving * expected
        steps = max(steps, expected)
    return Remaining(present + arriving, prompt, outputs, steps)


def _fresh(info: RelQueryInfo, expected: int) -> tuple[int, int, int]:
    """Prompt tokens, output tokens and decode steps of R's rows that never ran."""
    outputs = steps = 0
    for budget, count in info.fresh_rows.items():
        left = max(1, min(budget, expected))
        outputs += count * left
        steps = max(steps, left)
    return info.fresh_prompt_tokens, outputs, steps


def _running_outputs(
    info: RelQueryInfo, expected: int, outputs: int, steps: int
) -> tuple[int, int]:
    """`outputs` and `steps` with R's running and resumed rows added, each row's
    `row_remaining_output` inlined: this runs for every running row, each step."""
    for rows in (info.running.values(), info.resumed.values()):
        for seq in rows:
            cap = seq.max_tokens if seq.max_tokens < expected else expected
            left = cap - seq.output_tokens
            if left < 1:
                left = 1
            outputs += left
            if left > steps:
                steps = left
    return outputs, steps


class RemainingBook(dict[str, Remaining]):
    """Each unfinished relQuery's `Remaining`, with the prompt tokens and output tokens
    of all of them kept as running sums, so the backlog is priced in O(1) a step
    however many relQueries wait (`backlog`)."""

    def __init__(self) -> None:
        super().__init__()
        self.prompt_tokens = 0
        self.output_tokens = 0

    def __setitem__(self, relquery_id: str, left: Remaining) -> None:
        old = self.get(relquery_id)
        if old is not None:
            self.prompt_tokens -= old.prompt_tokens
            self.output_tokens -= old.output_tokens
        self.prompt_tokens += left.prompt_tokens
        self.output_tokens += left.output_tokens
        super().__setitem__(relquery_id, left)

    def __delitem__(self, relquery_id: str) -> None:
        old = self[relquery_id]
        self.prompt_tokens -= old.prompt_tokens
        self.output_tokens -= old.output_tokens
        super().__delitem__(relquery_id)

    def total(self) -> Remaining:
        """Everything left, as one relQuery (rows and steps not kept: 0)."""
        return Remaining(0, self.prompt_tokens, self.output_tokens, 0)
