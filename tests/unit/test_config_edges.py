"""Configuration is read from the environment only at the edges (issue 38): Settings
(streams/settings.py) and the command line (connectors/cli/), which pass the values in,
as procrastinate does. Read from the source with ast, like tests/unit/test_layers.py, so a
module that starts reading os.environ / os.getenv for itself fails here.

A few reads are not configuration but process plumbing, allowed by module and function
only, each with why (a new read elsewhere in the same module still fails)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("streams", "schemas", "projections", "connectors")
EDGES = ("streams/settings.py", "connectors/cli/")
PLUMBING: dict[str, dict[str, str]] = {
    "streams/lifecycle.py": {
        "limit_malloc_arenas": "sets glibc's MALLOC_ARENA_MAX for the children to inherit",
    },
    "connectors/remote.py": {
        "profile_path": "the platform's per-user config folder (XDG_CONFIG_HOME, like HOME)",
    },
    "connectors/worker/worker.py": {
        "Worker.__init__": "the worker's PATH, HOME, LANG... handed on to the jobs",
    },
    "connectors/worker/secrets.py": {
        "Secrets.__init__": "CRONLOG_SECRET_<NAME>: runtime values jobs name, not settings; "
        "and the path of the grants file it reads per run (Settings check it at start)",
    },
    "connectors/worker/executor.py": {
        "ProcessExecutor.__init__": "the worker's environment handed on to its executor",
        "_pythonpath": "PYTHONPATH extended for the executor child",
    },
    "connectors/stack/postgres.py": {
        "PostgresStack._install": "the environment handed on to apt-get",
    },
    "connectors/stack/tools.py": {
        "ensure_test_tools": "the environment handed on to apt-get",
    },
}
ENV_NAMES = frozenset({"environ", "environb", "getenv", "getenvb", "putenv", "unsetenv"})


def environment_reads(source: str, filename: str = "<source>") -> list[tuple[int, str]]:
    """(line, enclosing function's qualified name, "" at module level) of every use of
    os.environ, os.getenv and their kin, however os or the name was imported."""
    tree = ast.parse(source, filename)
    os_names = {"os"}
    bare: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            os_names.update(a.asname or a.name for a in node.names if a.name == "os")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            bare.update(a.asname or a.name for a in node.names if a.name in ENV_NAMES)
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = f"{where}.{child.name}" if where else child.name
            if (
                isinstance(child, ast.Attribute)
                and child.attr in ENV_NAMES
                and isinstance(child.value, ast.Name)
                and child.value.id in os_names
            ) or (isinstance(child, ast.Name) and child.id in bare):
                found.append((child.lineno, where))
            if (
                isinstance(child, ast.ImportFrom)
                and child.module == "os"
                and any(a.name in ENV_NAMES for a in child.names)
            ):
                found.append((child.lineno, where))
            visit(child, inner)

    visit(tree, "")
    return found


def _modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))


def _is_edge(relative: str) -> bool:
    return any(relative == e or (e.endswith("/") and relative.startswith(e)) for e in EDGES)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_edges_read_the_environment(path: Path) -> None:
    relative = str(path.relative_to(ROOT))
    if _is_edge(relative):
        return
    allowed = PLUMBING.get(relative, {})
    reads = [
        f"{relative}:{line} in {where or 'the module'}"
        for line, where in environment_reads(path.read_text(), relative)
        if where not in allowed
    ]
    assert not reads, (
        f"configuration is read at the edges (streams/settings.py, connectors/cli/) and "
        f"passed in; these read the environment themselves: {reads}"
    )


@pytest.mark.parametrize(
    ("relative", "where"),
    [(relative, where) for relative, places in PLUMBING.items() for where in places],
)
def test_every_plumbing_exception_is_still_there(relative: str, where: str) -> None:
    """The list stays true: an exception no longer needed is taken off it."""
    places = {w for _, w in environment_reads((ROOT / relative).read_text(), relative)}
    assert where in places, f"{relative}: {where} no longer reads the environment"


def test_the_scan_sees_every_way_of_reading() -> None:
    source = (
        "import os\nimport os as o\nfrom os import getenv, environ as e\n"
        "A = os.environ.get('X')\n"
        "def f():\n    return o.getenv('Y')\n"
        "class C:\n    def m(self):\n        return e['Z'], getenv('W')\n"
    )
    reads = environment_reads(source)
    assert (4, "") in reads
    assert (6, "f") in reads
    assert (9, "C.m") in reads
    assert (3, "") in reads  # the import itself
    harmless = "import os\nfrom os import path\nos.getpid()\nenv = {}\nenv.get('X')\n"
    assert environment_reads(harmless) == []
