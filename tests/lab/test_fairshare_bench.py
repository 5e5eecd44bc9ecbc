"""`relstream-lab bench fairshare` on a short trace: each variant's token shares, counted
from the steps, as the report says them."""

import json

from click.testing import CliRunner

from relstream_lab.cli import main
from relstream_lab.fairshare.run import VARIANTS, shares


def test_a_short_trace_reports_each_querys_share_of_the_tokens(tmp_path):
    args = [
        "bench", "fairshare", "--bundled", "--profiles", "cpu-smollm2", "--seeds", "0",
        "--minutes", "1", "--heavy-rows", "10-20", "--light-rows", "1-3",
        "--workers", "1", "--out", str(tmp_path),
    ]  # fmt: skip
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    (run,) = json.loads((tmp_path / "results.json").read_text())["runs"]
    assert run["relqueries"]["heavy"] > 0 and run["relqueries"]["light"] > 0
    for label in VARIANTS:
        tokens = run[label]["tokens"]
        assert tokens["heavy"] > 0 and tokens["light"] > 0
        assert abs(sum(shares(run, label).values()) - 1) < 1e-9
    # Equal weights even the shares out against relstream's own order.
    fair, plain = shares(run, "relstream fair 1:1")["heavy"], shares(run, "relstream")["heavy"]
    assert abs(fair - 0.5) < abs(plain - 0.5)
    assert "| cpu-smollm2 | 0 |" in (tmp_path / "README.md").read_text()
