"""The JSON Schema of every message kind, generated from the types in `messages`.

The generated files are committed under `relstream/wire/json/` for producers in other
languages; `python -m relstream.wire` rewrites them, and a test fails when they drift
from the types. msgpack's bin type (dead letters' `original`) has no JSON equivalent: its
schema says so in the field's description.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import msgspec

from relstream.wire.kinds import KINDS

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_BASE_URI = "https://relstream.dev/schemas/"


def json_schema(kind: str) -> dict[str, Any]:
    """The schema of one message kind, self-contained (definitions inlined under $defs)."""
    message_type = KINDS[kind]
    generated = msgspec.json.schema(message_type)
    definitions = generated.get("$defs", {})
    root = definitions.pop(message_type.__name__)
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"{SCHEMA_BASE_URI}{kind}.schema.json",
        **root,
        "title": kind,
        **({"$defs": definitions} if definitions else {}),
    }


def schema_text(kind: str) -> str:
    return json.dumps(json_schema(kind), indent=2) + "\n"


def committed_schema_text(kind: str) -> str:
    return resources.files(__package__).joinpath("json", f"{kind}.schema.json").read_text()


def write_schemas(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for kind in KINDS:
        path = folder / f"{kind}.schema.json"
        path.write_text(schema_text(kind))
        written.append(path)
    return written
