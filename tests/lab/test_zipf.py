"""The Zipf stream benchmark's trace and accounting (relstream_lab.zipf.sim), on a short
trace of the real table."""

from dataclasses import replace

import pytest

from relstream_lab.common.workload import DEFAULT_DATASETS_DIR
from relstream_lab.zipf.sim import TABLE, ZipfOptions, read_beers, run_seed, zipf_windows

pytestmark = pytest.mark.skipif(
    not (DEFAULT_DATASETS_DIR / TABLE).is_file(), reason="needs ../shared/datasets"
)
OPTIONS = ZipfOptions(DEFAULT_DATASETS_DIR, relqueries=40, max_rows=12)
BEERS = 355  # distinct beers in ratebeer.csv


def test_beers_are_drawn_by_a_zipf_law_over_the_table():
    assert len(read_beers(DEFAULT_DATASETS_DIR)) == BEERS
    rows = [
        beer
        for window in zipf_windows(replace(OPTIONS, relqueries=2000), 0, BEERS)
        for beer in window
    ]
    counts = sorted((rows.count(beer) for beer in set(rows)), reverse=True)
    # s = 1: the most drawn beer about twice the second and ten times the tenth
    assert 1.5 < counts[0] / counts[1] < 2.7 and 6 < counts[0] / counts[9] < 15
    assert (
        zipf_windows(OPTIONS, 0, BEERS)
        == zipf_windows(OPTIONS, 0, BEERS)
        != zipf_windows(OPTIONS, 1, BEERS)
    )


def test_each_mechanism_runs_fewer_requests_and_the_rows_all_count():
    records = {r["variant"]: r for r in run_seed(("a100-opt13b", 0, OPTIONS))}
    rows = sum(len(window) for window in zipf_windows(OPTIONS, 0, BEERS))
    distinct = len({beer for window in zipf_windows(OPTIONS, 0, BEERS) for beer in window})
    stock = records["v1-fcfs"]
    once = records["relstream + computed once"]
    cached = records["relstream + computed once + answer cache"]
    assert stock["requests_run"] == rows == cached["rows"]
    assert distinct <= once["requests_run"] < rows
    assert once["requests_run"] + once["requests_followed"] == rows
    assert cached["requests_run"] == distinct  # each beer computed once in the whole trace
    assert cached["requests_cached"] + cached["requests_followed"] == rows - distinct
    assert cached["prompt_tokens_computed"] < once["prompt_tokens_computed"]
