"""`python -m relstream.wire`: rewrite the committed JSON Schemas from the types."""

from pathlib import Path

from relstream.wire.jsonschema import write_schemas

for path in write_schemas(Path(__file__).with_name("json")):
    print(path)
