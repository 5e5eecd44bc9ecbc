"""The templates an engine served lately, which its load reports name
(`BackendLoad.templates`) so that a placer sends a relQuery where its template's prefix is
likely cached. Both backends, the vLLM runtime and the simulated one, keep one."""

from __future__ import annotations

from collections import deque

from relstream.backend import template_id

RECENT_TEMPLATES = 8  # templates a load report names


class RecentTemplates:
    """Ids of the templates an engine served lately, newest first, at most
    RECENT_TEMPLATES (a placer prefers an engine whose prefix cache holds one)."""

    def __init__(self) -> None:
        self._ids: deque[str] = deque(maxlen=RECENT_TEMPLATES)

    def note(self, text: str) -> None:
        tid = template_id(text)
        if tid in self._ids:
            self._ids.remove(tid)
        self._ids.appendleft(tid)

    def ids(self) -> tuple[str, ...]:
        return tuple(self._ids)
