"""The ceiling table: stock V1's mean over each ordering's, computed by hand."""

from relstream_lab.campaign.ceiling import table


def test_the_ceiling_table_divides_stock_v1s_mean_by_each_orderings():
    means = {
        "relstream": 50.0,
        "clairvoyant": 25.0,
        "v1-fcfs": 100.0,
        "v1-priority": 75.0,
    }
    header, rule, row = table([{"epoch": 1, "seed": 2, "load": 1.3, "mean": means}])
    assert header.count("|") == rule.count("|") == row.count("|") == 7
    # fcfs over relstream, clairvoyant; priority over relstream, clairvoyant
    assert row == "| 1 | 2 | 2.00x | 4.00x | 1.50x | 3.00x |"
