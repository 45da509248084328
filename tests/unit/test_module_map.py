"""The map stays true (issue 38): the module table of docs/architecture.md ("Where each
concept lives") names every module of the four packages, and names none that does not
exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("streams", "schemas", "projections", "connectors")
SECTION = "## Where each concept lives"


def table_paths() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    rows = [line for line in text[start:end].splitlines() if line.startswith("| ")]
    assert len(rows) > 20, "the module table was not found"
    named: set[str] = set()
    for row in rows:
        named.update(re.findall(r"`([a-z_/]+\.py)`", row))
    return named


def modules() -> set[str]:
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "__init__.py" and not path.read_text().strip().count("\n") > 5:
                continue  # a package marker (a docstring at most), not a module of its own
            found.add(str(path.relative_to(ROOT)))
    return found


def test_every_module_is_in_the_table() -> None:
    missing = sorted(modules() - table_paths())
    assert not missing, f"modules docs/architecture.md's table does not name: {missing}"


def test_the_table_names_no_module_that_does_not_exist() -> None:
    stale = sorted(p for p in table_paths() if not (ROOT / p).exists())
    assert not stale, f"the table names modules that do not exist: {stale}"
