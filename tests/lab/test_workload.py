import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from relstream.connectors.tables import load_csv
from relstream.model import RelQuery, Row, Sampling, Template
from relstream_lab.common.templates import MAX_TOKENS, PAPER_DATASETS
from relstream_lab.common.workload import (
    DEFAULT_DATASETS_DIR,
    TraceConfig,
    TraceEntry,
    answer_key,
    generate_relqueries,
    load_datasets,
    tokenize_trace,
    unit_gaps,
)


def test_bundled_trace_follows_the_paper_recipe():
    config = TraceConfig(num_relqueries=60, seed=4)
    datasets = load_datasets(None)
    entries = generate_relqueries(config, datasets)
    assert len(entries) == 60
    table_rows = len(datasets[0].table.rows)
    for entry in entries:
        assert 1 <= len(entry.relquery.rows) <= min(100, table_rows)
        assert entry.relquery.max_output_tokens == MAX_TOKENS[entry.query_type]
    assert {e.query_type for e in entries} == set(MAX_TOKENS)
    arrivals = [e.relquery.arrival_time for e in entries]
    assert arrivals == sorted(arrivals)


def test_trace_is_seeded():
    datasets = load_datasets(None)

    def ids(seed):
        return [e.relquery.id for e in generate_relqueries(TraceConfig(seed=seed), datasets)]

    assert ids(1) == ids(1)
    assert ids(1) != ids(2)


def test_rates_rescale_the_same_trace():
    config = TraceConfig(num_relqueries=5)
    trace = tokenize_trace(generate_relqueries(config, load_datasets(None)), config)
    slow, fast = trace.at_rate(0.5, 16), trace.at_rate(2.0, 16)
    assert [r.relquery_id for r in slow] == [r.relquery_id for r in fast]
    assert slow[-1].arrival_time == pytest.approx(4 * fast[-1].arrival_time)
    for relquery in slow:
        for request in relquery.requests:
            assert 1 <= request.output_length <= relquery.max_tokens
            assert request.prompt_tokens > 20  # the chat template alone is ~20 tokens


def test_poisson_and_gamma_gaps_have_the_requested_shape():
    poisson = unit_gaps(TraceConfig(num_relqueries=4000, seed=1))
    assert statistics.fmean(poisson) == pytest.approx(1.0, rel=0.06)
    bursty = unit_gaps(TraceConfig(num_relqueries=4000, arrival="gamma", burstiness=2.0, seed=1))
    cv = statistics.pstdev(bursty) / statistics.fmean(bursty)
    assert cv == pytest.approx(2.0, rel=0.15)


def test_bad_trace_settings_are_rejected():
    with pytest.raises(ValueError, match="rows range"):
        TraceConfig(min_rows=5, max_rows=2)
    with pytest.raises(ValueError, match="arrival"):
        TraceConfig(arrival="uniform")


def test_csv_loader_strips_llm_sql_prefixes_and_keys_rows(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text(',title,score\n7,"title: A, B",score: 3\n9,title: C,score:\n')
    table = load_csv(path)
    assert table.columns == ("title", "score")
    assert [(row.key, dict(row.values)) for row in table.rows] == [
        ("7", {"title": "A, B", "score": "3"}),
        ("9", {"title": "C", "score": ""}),
    ]


def test_csv_loader_names_the_bad_line(tmp_path: Path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n3\n")
    with pytest.raises(ValueError, match=r"t.csv:3: 1 fields, header has 2"):
        load_csv(path)


@pytest.mark.skipif(not DEFAULT_DATASETS_DIR.exists(), reason="../shared/datasets not present")
def test_paper_templates_match_the_paper_tables():
    datasets = load_datasets(DEFAULT_DATASETS_DIR)
    assert [d.spec.name for d in datasets] == [spec.name for spec in PAPER_DATASETS]
    assert len(datasets[0].table.rows) == 10_000


def _relquery(name: str, rows: list[Row], max_tokens: int = 8, arrival: float = 0.0) -> RelQuery:
    return RelQuery(name, Template("Rate {title}."), rows, max_tokens, arrival_time=arrival)


def test_rows_the_engine_answers_once_share_one_answer_key():
    a, b = Row("1", {"title": "Dune"}), Row("2", {"title": "Emma"})
    first, second = _relquery("q1", [a, b]), _relquery("q2", [b])
    other_limit = _relquery("q3", [b], max_tokens=9)
    config = TraceConfig()
    entries = [TraceEntry(rq, "t", "rating") for rq in (first, second, other_limit)]
    trace = tokenize_trace(entries, config, {"q1": [3, 4], "q2": [4], "q3": [4]})
    keys = {rq.relquery_id: [r.answer_key for r in rq.requests] for rq in trace.at_rate(1.0, 16)}
    assert keys["q1"][1] == keys["q2"][0]  # Emma, the same prompt, limit and sampling
    assert keys["q1"][0] != keys["q1"][1]
    assert keys["q3"][0] not in keys["q1"]  # another token limit: another answer
    seeded_free = replace(second, sampling=Sampling(temperature=0.7))
    assert answer_key(seeded_free, [1, 2, 3]) is None  # unseeded sampling is never shared
