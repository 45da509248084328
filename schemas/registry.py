"""The schema files, their versions and fingerprints.

Layout (`schemas/avro/`):

- `<name>.avsc`: the current schema of one topic's values (`TOPIC_SCHEMAS`). It may refer
  by name to types defined in any other file of the directory: `common.avsc` (a JSON array
  of the shared named types: JobSpec, Resources, the enums) or another topic's file
  (worker_inbox refers to dispatch's DispatchRequest). Every named type is defined once.
- `history/<name>.v<N>.avsc`: every version ever shipped, N = 1, 2, ..., self-contained
  (shared types expanded), the newest equal to the current one. Decoders know the
  fingerprints of all of them and read old records by Avro schema resolution.

Changing a schema: edit the file(s) above, then `python -m schemas.registry snapshot`,
which writes `history/<name>.v<N+1>.avsc` for every schema that changed. The unit tests
fail until it is done, and check that the new version can read every older one.

Fingerprints: CRC-64-AVRO (Rabin) of the Parsing Canonical Form, as 8 little-endian
bytes: the single-object encoding header is b"\\xc3\\x01" + fingerprint.
"""

from __future__ import annotations

import copy
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import orjson
from fastavro.schema import fingerprint, parse_schema, to_parsing_canonical_form

AVRO_DIR = Path(__file__).resolve().parent / "avro"
MARKER = b"\xc3\x01"
HEADER_LENGTH = len(MARKER) + 8

# schema name (file stem) -> topic (without the prefix) whose values it describes.
TOPIC_SCHEMAS: dict[str, str] = {
    "job_log": "job-log",
    "run_event": "run-events",
    "job_state": "jobs",
    "run_state": "runs",
    "dispatch": "dispatch",
    "heartbeat": "heartbeats",
    "worker_inbox": "worker-inbox",
    "run_log": "run-logs",
}

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
_HISTORY_FILE = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<version>[0-9]+)\.avsc$")


class SchemaError(Exception):
    """The schema files are inconsistent (undefined or twice defined names, bad history)."""


@dataclass(frozen=True, eq=False)
class SchemaVersion:
    """One version of one topic schema, ready to write or to read with."""

    name: str
    version: int
    schema: Any  # self-contained JSON schema (plain dicts and lists; docs and defaults kept)
    parsed: Any = field(repr=False)  # fastavro's parse_schema(schema)
    canonical: str = field(repr=False)  # Parsing Canonical Form
    fingerprint: bytes  # CRC-64-AVRO, 8 bytes little-endian
    header: bytes  # MARKER + fingerprint: the first 10 bytes of every record written


@dataclass(frozen=True, eq=False)
class TopicSchema:
    """A topic schema: its current version and every version a record may be written in."""

    name: str
    topic: str
    current: SchemaVersion
    versions: tuple[SchemaVersion, ...]  # history, oldest first (current included once)

    def by_fingerprint(self) -> dict[bytes, SchemaVersion]:
        """Writer schemas by fingerprint; on a tie (versions differing only in docs or
        defaults, which the canonical form drops) the newest wins."""
        return {v.fingerprint: v for v in self.versions}


def _fullname(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _walk_definitions(
    schema: Any, namespace: str, origin: str, out: dict[str, tuple[Any, str]]
) -> None:
    """Index every named type defined in `schema` by full name (with its namespace made
    explicit, so the definition can be inlined anywhere)."""
    if isinstance(schema, list):
        for branch in schema:
            _walk_definitions(branch, namespace, origin, out)
        return
    if not isinstance(schema, dict):
        return
    kind = schema.get("type")
    if kind in NAMED:
        name = _fullname(schema["name"], schema.get("namespace", namespace))
        if name in out:
            raise SchemaError(f"{name} defined twice: in {out[name][1]} and {origin}")
        namespace = name.rpartition(".")[0]
        out[name] = ({**schema, "namespace": namespace}, origin)
        for f in schema.get("fields", ()):
            _walk_definitions(f["type"], namespace, origin, out)
    elif kind == "array":
        _walk_definitions(schema["items"], namespace, origin, out)
    elif kind == "map":
        _walk_definitions(schema["values"], namespace, origin, out)
    elif isinstance(kind, dict | list):
        _walk_definitions(kind, namespace, origin, out)


def _expand(
    schema: Any, namespace: str, defined: set[str], library: dict[str, tuple[Any, str]]
) -> Any:
    """`schema` with each named type it refers to inlined at its first use (a copy)."""
    if isinstance(schema, str):
        if schema in PRIMITIVES:
            return schema
        name = _fullname(schema, namespace)
        if name in defined:
            return schema
        if name not in library:
            raise SchemaError(f"unknown type {schema!r} (namespace {namespace!r})")
        return _expand(copy.deepcopy(library[name][0]), namespace, defined, library)
    if isinstance(schema, list):
        return [_expand(branch, namespace, defined, library) for branch in schema]
    if not isinstance(schema, dict):
        raise SchemaError(f"not a schema: {schema!r}")
    kind = schema["type"]
    if kind in NAMED:
        name = _fullname(schema["name"], schema.get("namespace", namespace))
        if name in defined:
            raise SchemaError(f"{name} defined twice in one schema")
        defined.add(name)
        inner = name.rpartition(".")[0]
        if "fields" in schema:
            fields = [
                {**f, "type": _expand(f["type"], inner, defined, library)} for f in schema["fields"]
            ]
            return {**schema, "fields": fields}
        return schema
    if kind == "array":
        return {**schema, "items": _expand(schema["items"], namespace, defined, library)}
    if kind == "map":
        return {**schema, "values": _expand(schema["values"], namespace, defined, library)}
    return {**schema, "type": _expand(kind, namespace, defined, library)}


def _read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as err:
        raise SchemaError(f"{path}: not JSON: {err}") from err


def current_schemas(avro_dir: Path = AVRO_DIR) -> dict[str, Any]:
    """The self-contained current schema of every topic schema file in `avro_dir`."""
    sources = {p.stem: _read_json(p) for p in sorted(avro_dir.glob("*.avsc"))}
    library: dict[str, tuple[Any, str]] = {}
    for stem, source in sources.items():
        _walk_definitions(source, "", f"{stem}.avsc", library)
    missing = set(TOPIC_SCHEMAS) - set(sources)
    if missing:
        raise SchemaError(f"missing schema files in {avro_dir}: {sorted(missing)}")
    return {name: _expand(sources[name], "", set(), library) for name in TOPIC_SCHEMAS}


def history_files(name: str, avro_dir: Path = AVRO_DIR) -> list[tuple[int, Path]]:
    """(version, path) of `name`'s history, oldest first; versions must be 1..N."""
    found = []
    for path in (avro_dir / "history").glob(f"{name}.v*.avsc"):
        match = _HISTORY_FILE.match(path.name)
        if match and match["name"] == name:
            found.append((int(match["version"]), path))
    found.sort()
    if [v for v, _ in found] != list(range(1, len(found) + 1)):
        raise SchemaError(f"history of {name} is not v1..vN: {[p.name for _, p in found]}")
    return found


def make_version(name: str, version: int, schema: Any) -> SchemaVersion:
    # parse_schema adds fastavro's private keys to dicts it is given: hand it a copy.
    parsed = parse_schema(copy.deepcopy(schema))
    canonical = to_parsing_canonical_form(parsed)
    digest = bytes.fromhex(fingerprint(canonical, "CRC-64-AVRO"))
    return SchemaVersion(name, version, schema, parsed, canonical, digest, MARKER + digest)


def load_topic_schema(name: str, current: Any, avro_dir: Path = AVRO_DIR) -> TopicSchema:
    """`name`'s versions; the current one is the history version equal to it, or if it
    has not been snapshotted yet (the tests catch that) a version N+1 of its own."""
    versions = [
        make_version(name, version, _read_json(path))
        for version, path in history_files(name, avro_dir)
    ]
    same = [v for v in versions if v.schema == current]
    if same:
        now = same[-1]
    else:
        now = make_version(name, len(versions) + 1, current)
        versions.append(now)
    return TopicSchema(name, TOPIC_SCHEMAS[name], now, tuple(versions))


def load_all(avro_dir: Path = AVRO_DIR) -> dict[str, TopicSchema]:
    return {
        name: load_topic_schema(name, schema, avro_dir)
        for name, schema in current_schemas(avro_dir).items()
    }


@cache
def shipped() -> dict[str, TopicSchema]:
    """The topic schemas of this package, loaded once."""
    return load_all(AVRO_DIR)


@cache
def _fingerprints() -> dict[bytes, SchemaVersion]:
    return {fp: v for t in shipped().values() for fp, v in t.by_fingerprint().items()}


def identify(data: bytes) -> SchemaVersion | None:
    """The schema version that wrote `data` (any topic), or None if not one of ours."""
    if len(data) < HEADER_LENGTH or data[:2] != MARKER:
        return None
    return _fingerprints().get(bytes(data[2:HEADER_LENGTH]))


def snapshot(avro_dir: Path = AVRO_DIR) -> list[Path]:
    """Write history/<name>.v<N+1>.avsc for each current schema not yet in the history."""
    written = []
    (avro_dir / "history").mkdir(exist_ok=True)
    for name, schema in current_schemas(avro_dir).items():
        history = history_files(name, avro_dir)
        if history and _read_json(history[-1][1]) == schema:
            continue
        path = avro_dir / "history" / f"{name}.v{len(history) + 1}.avsc"
        path.write_bytes(orjson.dumps(schema, option=orjson.OPT_INDENT_2) + b"\n")
        written.append(path)
    return written


def _main(argv: list[str]) -> int:
    if argv != ["snapshot"]:
        print("usage: python -m schemas.registry snapshot", file=sys.stderr)
        return 2
    for path in snapshot():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
