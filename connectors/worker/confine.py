"""What a job running as its worker's own user cannot see: the worker's files.

A worker that cannot change users (started as a normal user; `cronlog run` as one) runs
its jobs as itself, so by file permissions alone a job could read the worker's state
folder (journal, executor logs, the seals of the attempts it holds), its secrets folder
and its credential files. With bubblewrap (`bwrap`, the sandbox Flatpak is built on,
needing no privilege where unprivileged user namespaces are allowed) each such job runs
in a mount namespace of its own where those paths are covered (a folder by an empty
tmpfs, a file by /dev/null) and only the job's own working directory shows through.

The covers are made in a user namespace the job gets no capability in (bwrap drops them
all before the job starts), and a namespace the job makes itself sees them as locked
mounts: it cannot lift them. The rest of the machine looks as it does to the worker's
user. A worker that runs jobs as another user (`--run-as`) needs none of this: the
permissions of the worker's files keep that user out.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

PROGRAM = "bwrap"


@dataclass(frozen=True, slots=True)
class Confinement:
    program: str  # bwrap's absolute path
    hidden: tuple[str, ...]  # absolute paths covered for every job

    def wrap(self, argv: Sequence[str], work: Path, path: str | None = None) -> list[str]:
        """`argv` run by bwrap, the hidden paths covered, `work` (the job's working
        directory, which may lie under a hidden folder) shown through. The program is
        looked up here, in the job's `path`, so that a missing one is said as plainly
        as without bwrap."""
        if "/" not in argv[0] and shutil.which(argv[0], path=path) is None:
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        command = [self.program, "--dev-bind", "/", "/"]
        for path in self.hidden:
            if os.path.isdir(path):
                command += ["--tmpfs", path]
            elif os.path.lexists(path):
                command += ["--ro-bind", "/dev/null", path]
        # bwrap makes the mount point inside a covering tmpfs itself.
        command += ["--bind", str(work), str(work), "--chdir", str(work), "--", *argv]
        return command

    def args(self) -> list[str]:
        """The executor's options that rebuild this confinement."""
        return ["--bwrap", self.program, *(a for p in self.hidden for a in ("--hide", p))]


def confinement(hidden: Iterable[Path | str], program: str | None = None) -> Confinement | str:
    """A working confinement hiding these paths (those that exist; relative ones made
    absolute), or why there is none here: bwrap missing, or unable to make its
    namespaces (a kernel or container that forbids unprivileged user namespaces)."""
    found = program or shutil.which(PROGRAM)
    if found is None:
        return "bubblewrap (bwrap) is not installed"
    paths = tuple(sorted({os.path.abspath(p) for p in hidden if os.path.lexists(p)}))
    made = Confinement(found, paths)
    try:
        with tempfile.TemporaryDirectory(prefix="cronlog-confine-") as work:
            probe = subprocess.run(
                made.wrap(["true"], Path(work)),
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap cannot run: {exc}"
    if probe.returncode != 0:
        return f"bwrap cannot make its namespaces here: {probe.stderr.strip()[:200]}"
    return made
