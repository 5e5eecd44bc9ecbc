"""A window's relQuery id, `<query>-<partition>-<first offset>@<first row's ms>`: the one
place it is written (`format`, by the worker's windowing, its recut and `reset`) and read
(`parse`, by reset's snapping, the door, the sinks' joins, usage and the engine's tags).

The id names the window by where it starts, in which incarnation of the topic (the
first row's timestamp), so a window read again comes under the id it had. An id of any
other shape is not a window's: a relQuery sent straight to the engine. Releases before
`@<ms>` named windows `<query>-<partition>-<first offset>`; such an id still says its
query (`query_of`) but not which rows it had, so `parse` reads none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHAPE = re.compile(
    r"(?P<query>.+)-(?P<partition>\d+)-(?P<offset>\d+)(?:@(?P<ms>-?\d+))?", re.DOTALL | re.ASCII
)


@dataclass(frozen=True)
class WindowId:
    query: str  # the registered query's name
    partition: int  # of its rows topic
    offset: int  # the window's first row's
    ms: int  # the first row's timestamp

    @classmethod
    def parse(cls, relquery_id: str) -> WindowId | None:
        """The window `relquery_id` names, or None where it names none (or is an id of
        a release before `@<ms>`)."""
        match = _SHAPE.fullmatch(relquery_id)
        if match is None or match["ms"] is None:
            return None
        return cls(match["query"], int(match["partition"]), int(match["offset"]), int(match["ms"]))

    @staticmethod
    def query_of(relquery_id: str) -> str | None:
        """The registered query whose window `relquery_id` is, in this release's shape or
        an earlier one's; None for any other id (a relQuery a client submitted itself)."""
        match = _SHAPE.fullmatch(relquery_id)
        return match["query"] if match else None

    def format(self) -> str:
        return f"{self.query}-{self.partition}-{self.offset}@{self.ms}"

    __str__ = format
