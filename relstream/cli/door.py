"""`relstream serve`'s bounds on what its HTTP door holds at once (`service/doorlimits.py`):
past any of them a request is a 429 with `Retry-After`."""

from __future__ import annotations

import click

from relstream.service.doorlimits import MAX_BODY_MIB, MAX_RELQUERIES, MAX_ROWS, DoorLimits

_OPTIONS = (
    click.option(
        "--http-max-relqueries",
        default=MAX_RELQUERIES,
        show_default=True,
        type=click.IntRange(1),
        help="RelQueries the HTTP door holds at once, served here or forwarded, from "
        "their request's arrival to their answer.",
    ),
    click.option(
        "--http-max-rows",
        default=MAX_ROWS,
        show_default=True,
        type=click.IntRange(1),
        help="Their rows; a relQuery of more rows is a 413.",
    ),
    click.option(
        "--http-max-mb",
        default=MAX_BODY_MIB,
        show_default=True,
        type=click.IntRange(1),
        help="Their request bodies, in MiB; a larger body is a 413.",
    ),
)


def door_limit_options(command):
    for option in reversed(_OPTIONS):
        command = option(command)
    return command


def door_limits(opts: dict) -> DoorLimits:
    """The bounds the options say, taken out of `opts`."""
    return DoorLimits(
        relqueries=opts.pop("http_max_relqueries"),
        rows=opts.pop("http_max_rows"),
        body_bytes=opts.pop("http_max_mb") << 20,
    )
