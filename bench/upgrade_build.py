"""Two releases of cronlog side by side: a commit's wheel in a venv of its own.

`build(ref)` exports the commit (`git archive`, so nothing uncommitted of the checkout
leaks into it), builds its wheel (`pip wheel --no-deps`) and installs it into a fresh venv
with its runtime dependencies pinned to the versions of the checkout's .venv (`pip
freeze` as constraints), so the two releases differ by cronlog's own code only. The venv
is kept under a temporary folder by commit id and used again by the next run.

Processes run the venv's `cronlog` entry point, never `python -m` from the checkout:
with the checkout as working directory, `-m` would import the checkout's packages first.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(tempfile.gettempdir()) / "cronlog-upgrade"
# Every new HEAD is a new venv: the cache keeps the most recently used ones only.
KEEP = 4


@dataclass(frozen=True)
class Release:
    ref: str  # as given (a branch, HEAD, a short id)
    commit: str  # the full commit id
    venv: Path
    version: str  # `cronlog --version`, or the commit for a release without the flag

    @property
    def cronlog(self) -> Path:
        return self.venv / "bin" / "cronlog"

    @property
    def short(self) -> str:
        return self.commit[:7]

    def records(self) -> set[tuple[str, int]]:
        """The record versions this release reads (its schema history)."""
        found = set()
        for lib in self.venv.glob("lib/python*/site-packages/schemas/avro/history"):
            for path in lib.glob("*.v*.avsc"):
                name, _, version = path.name.removesuffix(".avsc").rpartition(".v")
                found.add((name, int(version)))
        return found


def git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def newest_record_change() -> str:
    """The newest commit that changed a file of the schema history."""
    return git("log", "-1", "--format=%H", "--", "schemas/avro/history")


def default_from() -> str:
    """The release just before the newest change of the records: its parent."""
    return git("rev-parse", f"{newest_record_change()}^")


def build(ref: str, log: Path) -> Release:
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    home = CACHE / commit
    venv = home / "venv"
    done = home / "built"
    if not done.exists():
        with open(log, "ab") as out:
            _build_into(commit, home, venv, out)
    done.touch()  # used now: the last to be pruned
    prune()
    found = subprocess.run(
        [str(venv / "bin" / "cronlog"), "--version"], capture_output=True, text=True, check=False
    )
    version = found.stdout.strip() if found.returncode == 0 else f"cronlog at {commit[:7]}"
    return Release(ref, commit, venv, version)


def prune() -> None:
    """Remove the least recently used venvs beyond `KEEP`."""
    built = sorted(CACHE.glob("*/built"), key=lambda p: p.stat().st_mtime, reverse=True)
    for marker in built[KEEP:]:
        subprocess.run(["rm", "-rf", str(marker.parent)], check=True)


def _build_into(commit: str, home: Path, venv: Path, out: IO[bytes]) -> None:
    subprocess.run(["rm", "-rf", str(home)], check=True)
    src, wheels = home / "src", home / "wheels"
    src.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit], cwd=ROOT, check=True, capture_output=True
    )
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)

    def run(*argv: str) -> None:
        subprocess.run(argv, check=True, stdout=out, stderr=subprocess.STDOUT)

    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src))
    constraints = home / "constraints.txt"
    frozen = subprocess.run(
        [sys.executable, "-m", "pip", "freeze", "--exclude-editable"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    constraints.write_text(
        "".join(
            line + "\n" for line in frozen.splitlines() if "==" in line and "cronlog" not in line
        )
    )
    run(sys.executable, "-m", "venv", str(venv))
    wheel = next(wheels.glob("cronlog-*.whl"))
    run(str(venv / "bin" / "pip"), "install", "-q", "-c", str(constraints), str(wheel))
    run(str(venv / "bin" / "pip"), "check")
