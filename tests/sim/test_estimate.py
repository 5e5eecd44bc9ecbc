"""`relstream produce --estimate`: a table's prompt tokens counted before it is sent,
against the tokenizer itself on rows a person can follow (docs/usage.md)."""

from click.testing import CliRunner

from relstream.cli import main
from relstream.engine.tokenizer import chatml_prompt, encode_batch
from relstream.model import RelQuery, Row, Template
from relstream.sim.estimate import estimate

TEMPLATE = Template("Is this review positive? Answer yes or no. Review: {review}")
LONG = "word " * 600  # about 600 tokens: over a 512-token context with its budget


def relquery(rows: list[Row]) -> RelQuery:
    return RelQuery("q", TEMPLATE, rows, max_output_tokens=8)


def test_prompt_tokens_are_the_tokenizers_and_repeated_blocks_count_as_shared():
    rows = [
        Row("a", {"review": "great film"}),
        Row("b", {"review": "great film"}),  # the same prompt: every full block shared
        Row("c", {"review": None}),  # null input: never asked
        Row("d", {"review": LONG}),  # too long for a 512-token context
    ]
    found = estimate(relquery(rows), context_tokens=512, block_size=16)
    [one] = encode_batch([chatml_prompt(TEMPLATE.render({"review": "great film"}))])
    assert (found.rows, found.runnable, found.unrunnable, found.too_long) == (4, 2, 1, 1)
    assert found.prompt_tokens == 2 * len(one)
    assert found.prefix_cached_tokens == len(one) // 16 * 16
    assert found.output_budget == 16


def test_produce_estimate_needs_no_broker_and_sends_nothing(tmp_path):
    table = tmp_path / "reviews.csv"
    table.write_text("key,review\nr1,great film\nr2,dull\n")
    config = tmp_path / "queries.toml"
    config.write_text(
        '[[query]]\nname = "sentiment"\ntable = "reviews"\n'
        f'template = "{TEMPLATE.text}"\nmax_output_tokens = 8\n'
    )
    args = ["produce", str(table), "--table", "reviews", "--key-column", "key", "--estimate"]
    done = CliRunner().invoke(main, [*args, "--config", str(config)], terminal_width=200)
    assert done.exit_code == 0, done.output
    prompts = [chatml_prompt(TEMPLATE.render({"review": r})) for r in ("great film", "dull")]
    first, second = encode_batch(prompts)
    # The second prompt's full blocks that match the first's from its start (the chat
    # template and the instruction) are the shared ones.
    blocks = next(
        i
        for i in range(len(second) // 16 + 1)
        if first[: 16 * (i + 1)] != second[: 16 * (i + 1)] or 16 * (i + 1) > len(second)
    )
    share = 16 * blocks / (len(first) + len(second))
    [line] = [line for line in done.output.splitlines() if "sentiment" in line]
    assert [cell.strip() for cell in line.split("│")[1:7]] == [
        "sentiment", "2", "2", f"{len(first) + len(second):,}", f"{share:.0%}", "16",
    ]  # fmt: skip
    assert share > 0
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "--estimate needs --config" in refused.output
    no_broker = CliRunner().invoke(main, args[:-1])
    assert no_broker.exit_code == 2 and "Missing option '--bootstrap'" in no_broker.output
