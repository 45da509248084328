"""The job boundary under bubblewrap: what a job cannot see, reach or signal.

A worker that cannot change users (started as a normal user; `cronlog run` as one) runs
its jobs as itself, so by file permissions alone a job could read the worker's state
folder (journal, executor logs, the seals of the attempts it holds), its secrets folder
and its credential files. With bubblewrap (`bwrap`, the sandbox Flatpak is built on,
needing no privilege where unprivileged user namespaces are allowed) each job runs in
namespaces of its own:

- mounts: those paths are covered (a folder by an empty tmpfs, a file by /dev/null) and
  only the job's own working directory shows through; /tmp, /var/tmp and /dev/shm are
  private, empty tmpfs of this job alone, gone with it, so nothing an earlier run left
  there meets a later one; each has a size (`tmpfs_bytes`, 64 MiB by default, the
  output cap's default; bwrap's `--size`), so a job filling them gets ENOSPC instead
  of holding half the machine's RAM each (a tmpfs's default size);
- pids (`--unshare-pid`, with its own /proc): the job sees only its own processes, and
  cannot signal (nor read the environment of) the worker, its executor or any other job;
  bwrap's reaper is the namespace's init, so when it dies (the executor's SIGKILL of the
  job's group reaches it) the kernel kills everything left in the namespace, daemons
  that left the group included;
  where the host refuses a fresh /proc (a container masking parts of its own), the
  sandbox goes without this namespace (`own_pids`), and the worker says so at start;
- a user namespace the job gets no capability in (bwrap drops them all before the job
  starts): a namespace the job makes itself sees the covers as locked mounts it cannot
  lift.

The job's environment is applied inside the sandbox only. bwrap itself starts with a
fixed environment built from nothing (`PATH`, and the run's id and attempt, which the
worker looks for in /proc to find a job whose executor died), never the job's: an
owner's LD_PRELOAD (or LD_LIBRARY_PATH, GCONV_PATH...) handed to bwrap would run the
owner's code in bwrap before any namespace exists, with the worker's view of the
files. The job's variables go to bwrap as `--clearenv` and `--setenv NAME VALUE`
options read from a descriptor (`--args FD`, a memfd), not from its command line:
/proc/PID/cmdline is readable by every user of the machine, and the values include the
job's resolved secrets; a descriptor also has no ARG_MAX to overflow. A NUL in a name
or value would split it into options of bwrap's own (a `--bind` uncovering the state
folder), so such an environment is refused.

`--die-with-parent` is not used: it would SIGKILL the job the moment the outer bwrap
dies, and the outer bwrap dies of the SIGTERM the executor sends a job's group on a
timeout or a cancel, which would take the job's grace away (the job gets that SIGTERM
itself, being in the group, and SIGKILL follows after the grace, connectors/worker/
engine.py).

Jobs that run as another user (`--run-as`) get the same sandbox where bwrap works for
that user (the CLI probes it as that user): the permissions of the worker's files keep
them out already, and the sandbox adds the private /tmp and the PID namespace, so jobs
of different owners, all running as that one user, cannot signal each other or plant
files in each other's /tmp.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PROGRAM = "bwrap"
# bwrap's own environment: nothing of the job's, nothing of the worker's.
FIXED_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARKS = ("CRONLOG_RUN_ID", "CRONLOG_ATTEMPT")
# Private to each job: an empty tmpfs of its own.
PRIVATE = ("/tmp", "/var/tmp", "/dev/shm")
# The size of each of them (a tmpfs without one may take half the machine's RAM).
DEFAULT_TMPFS_BYTES = 64 * 1024 * 1024


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class Sandboxed:
    """A job's command under bwrap: `argv` and `env` are bwrap's own (no value of the
    job's environment in either), `args_fd` the memfd holding the job's environment as
    bwrap options (inheritable: the caller passes it to bwrap, then `close`s it)."""

    argv: list[str]
    env: dict[str, str]
    args_fd: int

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.args_fd)


def environment_options(env: Mapping[str, str]) -> bytes:
    """The job's environment as bwrap options, NUL-separated (what `--args` reads)."""
    out = [b"--clearenv"]
    for name, value in env.items():
        if "\0" in name or "\0" in value or "=" in name or not name:
            raise ValueError(f"environment variable {name[:64]!r}: no NUL, '=' or empty name")
        out += [b"--setenv", name.encode(), value.encode()]
    return b"\0".join(out) + b"\0"


@dataclass(frozen=True, slots=True)
class Confinement:
    program: str  # bwrap's absolute path
    hidden: tuple[str, ...]  # absolute paths covered for every job
    # A PID namespace (and /proc) of each job's own. Off only where the host refuses a
    # fresh /proc (a container that masks parts of its own): the covers still hold.
    own_pids: bool = True
    # The size of each private tmpfs (/tmp, /var/tmp, /dev/shm), in bytes.
    tmpfs_bytes: int = DEFAULT_TMPFS_BYTES

    def wrap(self, argv: Sequence[str], work: Path, env: Mapping[str, str]) -> Sandboxed:
        """`argv` run by bwrap with environment `env`, the hidden paths covered, `work`
        (the job's working directory, which may lie under a hidden folder) shown
        through. The program is looked up here, in the job's PATH, so that a missing
        one is said as plainly as without bwrap."""
        if "/" not in argv[0] and shutil.which(argv[0], path=env.get("PATH")) is None:
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        data = environment_options(env)
        fd = os.memfd_create("cronlog-job-env", 0)
        try:
            os.write(fd, data)  # a memfd takes it all at once
            os.lseek(fd, 0, os.SEEK_SET)
            os.set_inheritable(fd, True)
        except OSError:
            os.close(fd)
            raise
        command = [self.program, "--args", str(fd), "--dev-bind", "/", "/"]
        if self.own_pids:
            command = [*command[:3], "--unshare-pid", *command[3:], "--proc", "/proc"]
        for folder in PRIVATE:
            if os.path.isdir(folder):
                command += ["--size", str(self.tmpfs_bytes), "--tmpfs", folder]
        for path in self.hidden:
            if any(_under(path, folder) for folder in PRIVATE):
                continue  # under a private tmpfs already
            if os.path.isdir(path):  # a cover the job could write in: sized too
                command += ["--size", str(self.tmpfs_bytes), "--tmpfs", path]
            elif os.path.lexists(path):
                command += ["--ro-bind", "/dev/null", path]
        # bwrap binds from the host's tree, and makes the mount point inside a covering
        # tmpfs itself.
        command += ["--bind", str(work), str(work), "--chdir", str(work), "--", *argv]
        own = {"PATH": FIXED_PATH, **{k: env[k] for k in MARKS if k in env}}
        return Sandboxed(command, own, fd)

    def args(self) -> list[str]:
        """The executor's options that rebuild this confinement."""
        shared = [] if self.own_pids else ["--bwrap-shared-pids"]
        return [
            "--bwrap",
            self.program,
            *shared,
            "--bwrap-tmpfs-bytes",
            str(self.tmpfs_bytes),
            *(a for p in self.hidden for a in ("--hide", p)),
        ]


def confinement(
    hidden: Iterable[Path | str],
    program: str | None = None,
    run_as: tuple[int, int] | None = None,
    probe_in: Path | None = None,
) -> Confinement | str:
    """A working confinement hiding these paths (those that exist; relative ones made
    absolute) for jobs of this process's user, or of `run_as` (uid, gid), or why there is
    none here: bwrap missing, or unable to make its namespaces (a kernel or container
    that forbids unprivileged user namespaces, or a fresh /proc), or, probed with a
    working directory in `probe_in` (where the worker's run directories will be), unable
    to reach it as the job's user (bwrap binds it by its path: a folder above it that
    the job's user may not traverse)."""
    found = program or shutil.which(PROGRAM)
    if found is None:
        return "bubblewrap (bwrap) is not installed"
    paths = tuple(sorted({os.path.abspath(p) for p in hidden if os.path.lexists(p)}))
    made = _probe(Confinement(found, paths), run_as, probe_in)
    if isinstance(made, str) and made.startswith("bwrap cannot make"):
        # A host that refuses a fresh /proc in a new PID namespace: the covers and the
        # private /tmp without it, said at start by the caller (`own_pids`).
        shared = _probe(Confinement(found, paths, own_pids=False), run_as, probe_in)
        if not isinstance(shared, str):
            return shared
    return made


def _probe(
    made: Confinement, run_as: tuple[int, int] | None, probe_in: Path | None
) -> Confinement | str:
    """`made` if it runs `true` here as the job's user, else why not."""
    try:
        with tempfile.TemporaryDirectory(prefix="cronlog-confine-", dir=probe_in) as work:
            if run_as is not None:
                os.chown(work, *run_as)
            wrapped = made.wrap(["true"], Path(work), {"PATH": FIXED_PATH})
            try:
                probe = subprocess.run(
                    wrapped.argv,
                    env=wrapped.env,
                    pass_fds=(wrapped.args_fd,),
                    capture_output=True,
                    text=True,
                    timeout=10,
                    check=False,
                    cwd=work,
                    user=None if run_as is None else run_as[0],
                    group=None if run_as is None else run_as[1],
                    extra_groups=None if run_as is None else [],
                )
            finally:
                wrapped.close()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"bwrap cannot run: {exc}"
    if probe.returncode != 0:
        return f"bwrap cannot make its namespaces here: {probe.stderr.strip()[:200]}"
    return made
