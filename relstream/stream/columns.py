"""A template's columns against the rows it meets: which a row lacks, said with the
columns it has and the nearest (a typo such as `{reveiw}`): in each dead letter of a row
that lacks one (`windowing.check_row`), and at the worker's start from the newest rows
already on the table's topic (`newest`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

COLUMNS_SHOWN = 10  # a row's columns named in a message, at most


def lacking(needed: Iterable[str], values: dict) -> list[str]:
    """The columns of `needed` (in order, once each) that a row's `values` lack."""
    return [column for column in dict.fromkeys(needed) if column not in values]


def hint(missing: list[str], have: Iterable[str]) -> str:
    """What follows "lacks {x}": the columns the row has and, for a missing one close to
    one of them, "did you mean"."""
    have = sorted(have)
    named = ", ".join(have[:COLUMNS_SHOWN]) + (", ..." if len(have) > COLUMNS_SHOWN else "")
    near = [
        f"{{{found[0]}}} for {{{column}}}"
        for column in missing
        if (found := difflib.get_close_matches(column, have, n=1, cutoff=0.6))
    ]
    said = f" (it has {named or 'no columns'}"
    return said + (f"; did you mean {', '.join(near)}?)" if near else ")")


def missing_said(query: str, needed: Iterable[str], row_key: str, values: dict, where: str):
    """The warning where a row (`where` says which) lacks a column `query` uses; None
    where it has them all."""
    missing = lacking(needed, values)
    if not missing:
        return None
    names = ", ".join("{" + c + "}" for c in missing)
    return (
        f"query {query!r} uses {names}, which {where} ({row_key!r}) lacks"
        f"{hint(missing, values)}: every row without it is dead-lettered"
    )
