"""Can a reader schema read everything a writer schema writes? Avro schema resolution,
checked by the `avro` package's reader/writer compatibility checker (the Apache Avro
project's own rules), on self-contained JSON schemas (the history files' form).

`problems(writer, reader)` lists what stops the reader, each with where in the schema;
empty means the reader can read all the writer's data.
"""

from __future__ import annotations

from typing import Any

import orjson
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from avro.schema import parse


def problems(writer: Any, reader: Any) -> list[str]:
    """What `reader` (a JSON schema) cannot read of what `writer` writes."""
    checker = ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
    result = checker.get_compatibility(
        reader=parse(orjson.dumps(reader).decode()), writer=parse(orjson.dumps(writer).decode())
    )
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    return [
        f"{where}: {message}"
        for message, where in zip(result.messages, result.locations, strict=False)
    ]
