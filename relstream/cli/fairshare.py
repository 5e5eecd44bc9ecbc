"""`relstream engine --fair-share`: its options and the weights they give
(`scheduler.fairshare`, docs/priority.md)."""

from __future__ import annotations

import math

import click


def _fair_weights(values: tuple[str, ...]) -> dict[str, float]:
    weights = {}
    for value in values:
        query, _, text = value.rpartition("=")
        try:
            weight = float(text)
        except ValueError:
            weight = math.nan
        if not query or not weight > 0:
            raise click.BadParameter(f"{value!r}: give QUERY=WEIGHT, a weight above 0")
        weights[query] = weight
    return weights


def fair_share(opts: dict) -> dict[str, float] | None:
    """The fair-share weights (None: off), refused where they cannot apply."""
    if not opts["fair_share"]:
        if opts["fair_weights"]:
            raise click.UsageError("--fair-weight needs --fair-share")
        return None
    if opts["backend"] != "vllm":
        raise click.UsageError(
            f"--fair-share orders relQueries on one engine; --backend {opts['backend']} "
            "serves each alone"
        )
    if opts["policy"] != "relstream":
        raise click.UsageError(f"--fair-share needs --policy relstream, not {opts['policy']}")
    return opts["fair_weights"]


FAIR_SHARE_OPTIONS = (
    click.option(
        "--fair-share",
        is_flag=True,
        help="vllm, policy relstream: when several queries have windows waiting, serve "
        "each in proportion to its weight in tokens (docs/priority.md, Fair share).",
    ),
    click.option(
        "--fair-weight",
        "fair_weights",
        multiple=True,
        callback=lambda _c, _p, values: _fair_weights(values),
        metavar="QUERY=WEIGHT",
        help="With --fair-share: a query's weight (default 1.0); repeat for each query.",
    ),
)
