"""A window's relQuery id, `<query>-<partition>-<first offset>@<first row's ms>`, read
back: which registered query a relQuery came from (`stream.windowing` writes it).

An id of any other shape is not a window's: a relQuery sent straight to the engine, or
a window of a release before `@<ms>`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SHAPE = re.compile(r"(?P<query>.+)-(?P<partition>\d+)-(?P<offset>\d+)@(?P<ms>-?\d+)", re.DOTALL)


@dataclass(frozen=True)
class WindowId:
    query: str
    partition: int
    offset: int  # the window's first row's
    ms: int  # the first row's timestamp

    @classmethod
    def parse(cls, relquery_id: str) -> WindowId | None:
        """The window `relquery_id` names, or None where it names none."""
        match = _SHAPE.fullmatch(relquery_id)
        if match is None:
            return None
        return cls(match["query"], int(match["partition"]), int(match["offset"]), int(match["ms"]))

    def __str__(self) -> str:
        return f"{self.query}-{self.partition}-{self.offset}@{self.ms}"
