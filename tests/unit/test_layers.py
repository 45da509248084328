"""Every import points down: the records (schemas/records.py, schemas/spec.py) at the
bottom, the pure domain (streams/core/) on them, the codecs (the rest of schemas/) beside
the domain, the Kafka loops (streams/) above both, the projections and the connectors on
top. Read from the source with ast (imports inside functions count too), so a new arrow
running back up fails here rather than in a reader's head."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ("schemas.records", "schemas.spec")
# What the pure domain may use beyond the standard library: no Kafka, no database, no
# codec, no clock of its own (time comes in as arguments or through streams.core.clock).
DOMAIN_LIBRARIES = ("croniter", "tzdata", "orjson")
IO_LIBRARIES = ("confluent_kafka", "aiokafka", "psycopg", "fastavro", "httpx")


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize("path", _modules("schemas"), ids=lambda p: p.name)
def test_schemas_import_nothing_of_the_loops_projections_or_connectors(path: Path) -> None:
    upward = {n for n in _imports(path) if _within(n, ("streams", "projections", "connectors"))}
    assert not upward, f"{path.relative_to(ROOT)} imports {sorted(upward)}"


@pytest.mark.parametrize("path", [ROOT / "schemas/records.py", ROOT / "schemas/spec.py"])
def test_the_records_are_plain_dataclasses(path: Path) -> None:
    outside = {
        n
        for n in _imports(path)
        if _within(n, ("schemas", *IO_LIBRARIES)) and not _within(n, RECORDS)
    }
    assert not outside, f"{path.relative_to(ROOT)} imports {sorted(outside)}"


@pytest.mark.parametrize("path", _modules("streams/core"), ids=lambda p: p.name)
def test_the_domain_imports_only_itself_the_records_and_pure_libraries(path: Path) -> None:
    for name in _imports(path):
        if _within(name, ("streams", "schemas", "projections", "connectors")):
            assert _within(name, ("streams.core", *RECORDS)), f"{path.name} imports {name}"
        else:
            assert not _within(name, IO_LIBRARIES), f"{path.name} imports {name}"


@pytest.mark.parametrize("path", _modules("streams"), ids=lambda p: p.name)
def test_the_loops_never_import_projections_or_connectors(path: Path) -> None:
    upward = {n for n in _imports(path) if _within(n, ("projections", "connectors"))}
    assert not upward, f"{path.relative_to(ROOT)} imports {sorted(upward)}"


@pytest.mark.parametrize("path", _modules("projections"), ids=lambda p: p.name)
def test_the_projections_never_import_connectors(path: Path) -> None:
    upward = {n for n in _imports(path) if _within(n, ("connectors",))}
    assert not upward, f"{path.relative_to(ROOT)} imports {sorted(upward)}"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_import_circle_among_the_modules() -> None:
    """No module reaches itself through the imports of others, function-level imports
    included (a circle hidden in a function was found in projections/, issue 38)."""
    ours = {
        _module_name(p): p
        for folder in ("streams", "schemas", "projections", "connectors")
        for p in _modules(folder)
    }
    graph = {
        name: {i for i in _imports(path) if i in ours and i != name} for name, path in ours.items()
    }
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            circle = [*trail[trail.index(name) :], name]
            raise AssertionError(f"import circle: {' -> '.join(circle)}")
        if name in done:
            return
        for imported in sorted(graph[name]):
            visit(imported, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
