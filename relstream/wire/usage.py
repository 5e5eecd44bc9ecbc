"""What the engine computed for a row and for a relQuery, in tokens (docs/usage.md), and
what every wire struct is (`WIRE_STRUCT`)."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

# Every wire struct: unknown fields are ignored (forward compatibility) and fields at their
# default are not written (old readers never meet a field they could not know).
WIRE_STRUCT = {"omit_defaults": True, "forbid_unknown_fields": False, "kw_only": True}

Count = Annotated[int, Meta(ge=0)]


class RowUsage(msgspec.Struct, **WIRE_STRUCT):
    """Tokens the engine computed for a row: its prompt's tokens, of which
    `prefix_cached_tokens` came from vLLM's prefix cache (not computed again), and the
    output tokens it generated. A row answered from the answer cache or by an identical
    row's request cost none (docs/usage.md)."""

    prompt_tokens: Count = 0
    prefix_cached_tokens: Count = 0
    output_tokens: Count = 0


class Usage(RowUsage, **WIRE_STRUCT):
    """A relQuery's rows' `RowUsage` summed, and the rows that cost nothing: answered
    from the answer cache, or by an identical row's request in flight."""

    answer_cached_rows: Count = 0
    shared_rows: Count = 0
