"""Can a reader schema read everything a writer schema writes? (Avro schema resolution.)

A structural check of the resolution rules of the Avro specification, on schemas parsed
by fastavro (full names, named types in "__named_schemas"). `problems(writer, reader)`
lists each rule a pair breaks; empty means the reader can read all the writer's data.
"""

from __future__ import annotations

from typing import Any

_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


class _Checker:
    def __init__(self, writer: Any, reader: Any) -> None:
        self.writer_names: dict[str, Any] = dict(writer.get("__named_schemas", {}))
        self.reader_names: dict[str, Any] = dict(reader.get("__named_schemas", {}))
        self.in_progress: set[tuple[str, str]] = set()

    def resolve(self, schema: Any, names: dict[str, Any]) -> Any:
        """Follow name references and wrappers such as {"type": [...]} to the schema."""
        while True:
            if isinstance(schema, str) and schema in names:
                schema = names[schema]
            elif isinstance(schema, dict) and (
                isinstance(schema["type"], dict | list) or schema["type"] in names
            ):
                schema = schema["type"]
            else:
                return schema

    def kind(self, schema: Any) -> str:
        if isinstance(schema, list):
            return "union"
        if isinstance(schema, dict):
            return str(schema["type"])
        return str(schema)

    def check(self, writer: Any, reader: Any, path: str) -> list[str]:
        writer = self.resolve(writer, self.writer_names)
        reader = self.resolve(reader, self.reader_names)
        wkind, rkind = self.kind(writer), self.kind(reader)
        if wkind == "union":
            return [p for i, b in enumerate(writer) for p in self.check(b, reader, f"{path}|{i}")]
        if rkind == "union":
            closest: list[str] = []
            for branch in reader:
                found = self.check(writer, branch, path)
                if not found:
                    return []
                if self.kind(self.resolve(branch, self.reader_names)) == wkind:
                    closest = closest or found  # why the branch of the same kind fails
            return closest or [f"{path}: no branch of the reader union reads writer {wkind}"]
        if wkind in _PROMOTIONS or wkind in {"null", "boolean", "double"}:
            if rkind == wkind or rkind in _PROMOTIONS.get(wkind, ()):
                return []
            return [f"{path}: writer {wkind} cannot be read as {rkind}"]
        if wkind != rkind:
            return [f"{path}: writer {wkind} cannot be read as {rkind}"]
        if wkind == "array":
            return self.check(writer["items"], reader["items"], f"{path}[]")
        if wkind == "map":
            return self.check(writer["values"], reader["values"], f"{path}{{}}")
        return self.check_named(writer, reader, path)

    def check_named(self, writer: Any, reader: Any, path: str) -> list[str]:
        wname, rname = writer["name"], reader["name"]
        short = rname.rpartition(".")[2]
        aliases = {a.rpartition(".")[2] for a in reader.get("aliases", ())}
        if wname.rpartition(".")[2] not in {short, *aliases}:
            return [f"{path}: writer {wname} cannot be read as {rname}"]
        kind = writer["type"]
        if kind == "enum":
            missing = set(writer["symbols"]) - set(reader["symbols"])
            if missing and "default" not in reader:
                return [f"{path}: {rname} lacks symbols {sorted(missing)} and has no default"]
            return []
        if kind == "fixed":
            if writer["size"] != reader["size"]:
                return [f"{path}: {rname} size {writer['size']} != {reader['size']}"]
            return []
        key = (wname, rname)
        if key in self.in_progress:  # a recursive type: assume fine while checking it
            return []
        self.in_progress.add(key)
        written = {f["name"]: f for f in writer["fields"]}
        out = []
        for field in reader["fields"]:
            names = [field["name"], *field.get("aliases", ())]
            source = next((written[n] for n in names if n in written), None)
            where = f"{path}.{field['name']}" if path else field["name"]
            if source is not None:
                out += self.check(source["type"], field["type"], where)
            elif "default" not in field:
                out.append(f"{where}: new in {rname} without a default")
        self.in_progress.discard(key)
        return out


def problems(writer: Any, reader: Any) -> list[str]:
    """Why `reader` cannot read all data written with `writer` (both fastavro-parsed)."""
    return _Checker(writer, reader).check(writer, reader, "")
