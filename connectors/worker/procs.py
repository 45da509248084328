"""Process helpers shared by the worker and its executor (Linux)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from connectors.worker.outputcap import lowered, set_limit, spawn_by_fork, trampoline

_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_DUMPABLE = 4


def group_alive(pgid: int) -> bool:
    """Whether any process of process group ``pgid`` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to a process group; SIGCONT after SIGTERM so stopped members act on it."""
    for each in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, each)


def _prctl(option: int, value: int, name: str) -> str:
    """prctl(option, value) on this process: '' or why it could not be done."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(option, value, 0, 0, 0) != 0:
            return f"prctl({name}) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl({name}) unavailable: {exc}"
    return ""


def become_subreaper() -> str:
    """Adopt orphaned descendants (Linux), so they are reaped here, not left as zombies
    where init does not reap; '' or why that was not possible."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1, "PR_SET_CHILD_SUBREAPER")


def conceal() -> str:
    """Make this process's /proc entries (environ, mem, fd, ...) root's alone
    (PR_SET_DUMPABLE 0), so a job running as this process's own user cannot read its
    environment or memory: the worker's credentials and secrets. Jobs are not affected
    (exec makes a process dumpable again). '' or why it could not be done."""
    return _prctl(_PR_SET_DUMPABLE, 0, "PR_SET_DUMPABLE")


def limit_address_space(
    limit_bytes: int, report_fd: int, output_cap: int = 0
) -> Callable[[], None]:
    """A ``preexec_fn`` that sets ``RLIMIT_AS`` (soft and hard, never above an existing
    hard limit) and the output cap (``RLIMIT_FSIZE``, connectors/worker/outputcap.py),
    and writes b'ok' or the error to ``report_fd``. A limit of 0 or less sets nothing
    (and says ok)."""

    def apply() -> None:
        message = b"ok"
        try:
            set_limit(output_cap)
        except (OSError, ValueError) as exc:
            message = f"setrlimit(RLIMIT_FSIZE, {output_cap}) failed: {exc}".encode()
        if limit_bytes > 0 and message == b"ok":
            try:
                _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
                value = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
                resource.setrlimit(resource.RLIMIT_AS, (value, value))
            except (OSError, ValueError) as exc:
                message = f"setrlimit(RLIMIT_AS, {limit_bytes}) failed: {exc}".encode()
        with contextlib.suppress(OSError):
            os.write(report_fd, message)

    return apply


def decode_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from a wait status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


# Signals Python ignores that a job must get back with their default action (what
# subprocess's restore_signals does): an ignored disposition survives exec.
_RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)


class ProgramLookup:
    """`shutil.which` of a program name in a PATH, remembered for `keep_s`: a burst starts
    thousands of `sh` in a second, and each lookup stats every PATH entry (about 7 % of
    the executor's CPU per start, sampled). A PATH with a relative entry is looked up
    every time (it depends on the working directory)."""

    def __init__(self, keep_s: float = 1.0, most: int = 256) -> None:
        self.keep_s = keep_s
        self.most = most
        self._found: dict[tuple[str, str | None], tuple[float, str]] = {}

    def find(self, name: str, path: str | None) -> str | None:
        key = (name, path)
        now = time.monotonic()
        kept = self._found.get(key)
        if kept is not None and now - kept[0] < self.keep_s:
            return kept[1]
        program = shutil.which(name, path=path)
        if program is not None and path and all(os.path.isabs(p) for p in path.split(":")):
            if len(self._found) >= self.most:
                self._found.clear()
            self._found[key] = (now, program)
        return program

    def forget(self, name: str, path: str | None) -> bool:
        """Drop what was remembered of `name` in `path`; whether anything was."""
        return self._found.pop((name, path), None) is not None


_PROGRAMS = ProgramLookup()


def spawn(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    stdout: int,
    stderr: int,
    output_cap: int = 0,
) -> int:
    """Start a job with posix_spawn (vfork + exec: far less of this process's CPU than
    `subprocess.Popen`, docs/performance.md, "Real processes"): a new session and process
    group, stdin from /dev/null, stdout and stderr on the descriptors given
    (connectors/worker/rundirs.py made them; nothing is opened by name here). The program
    is looked up in the job's own PATH, as `subprocess` does. Returns the pid (the caller reaps it).
    Descriptors marked inheritable (a sandbox's `--args` memfd) are passed on.

    posix_spawn cannot set limits: the output cap (RLIMIT_FSIZE, `output_cap` bytes, 0:
    none) is this process's own for the spawn, which the job inherits, where this
    process may raise its limit back, else set by `prlimit` started in the job's place,
    which then execs it (connectors/worker/outputcap.py; without `prlimit`, capped jobs
    are started with `spawn_limited`).

    posix_spawn has no working-directory attribute here, so this process changes its
    own for the call: callers must be single-threaded (the executor is)."""
    if spawn_by_fork(output_cap):
        raise ValueError("the output cap needs spawn_limited here (no CAP_SYS_RESOURCE)")
    given = list(argv)
    through = trampoline(given, output_cap)
    # `prlimit` looks the program up in the same PATH: a missing one is said here, as
    # without it (the job's own argv[0] is kept).
    if through is not given and (
        not os.access(argv[0], os.X_OK)
        if "/" in argv[0]
        else _PROGRAMS.find(argv[0], env.get("PATH")) is None
    ):
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    with lowered(output_cap):
        return _spawn_found(through, env, cwd, stdout, stderr)


def _spawn_found(
    argv: Sequence[str], env: dict[str, str], cwd: Path, stdout: int, stderr: int
) -> int:
    program = argv[0] if "/" in argv[0] else _PROGRAMS.find(argv[0], env.get("PATH"))
    if program is None:
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    try:
        return _posix_spawn(program, argv, env, cwd, stdout, stderr)
    except FileNotFoundError:
        if "/" in argv[0] or not _PROGRAMS.forget(argv[0], env.get("PATH")):
            raise
    # The program found a moment ago is gone (a package upgrade): looked up afresh.
    program = _PROGRAMS.find(argv[0], env.get("PATH"))
    if program is None:
        raise FileNotFoundError(2, "No such file or directory", argv[0])
    return _posix_spawn(program, argv, env, cwd, stdout, stderr)


def _posix_spawn(
    program: str, argv: Sequence[str], env: dict[str, str], cwd: Path, stdout: int, stderr: int
) -> int:
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, stdout, 1),
        (os.POSIX_SPAWN_DUP2, stderr, 2),
    ]
    home = os.getcwd()
    os.chdir(cwd)
    try:
        return os.posix_spawn(
            program,
            list(argv),
            env,
            file_actions=actions,
            setsid=True,
            setsigdef=_RESTORED,
            setsigmask=(),
        )
    finally:
        os.chdir(home)


def spawn_limited(
    argv: Sequence[str],
    env: dict[str, str],
    cwd: Path,
    stdout: int,
    stderr: int,
    limit_bytes: int,
    run_as: tuple[int, int] | None = None,
    output_cap: int = 0,
    pass_fds: tuple[int, ...] = (),
) -> tuple[int, str]:
    """Like `spawn`, with RLIMIT_AS and the output cap (RLIMIT_FSIZE) set in the child
    before exec (fork + exec, since posix_spawn can neither set limits nor change the
    user), and as `run_as` (uid, gid, no supplementary groups) when given, `pass_fds`
    passed on. `limit_bytes` 0: no limit. Returns the pid and '' or why a limit was not
    applied (the job runs anyway)."""
    report_r, report_w = os.pipe()  # close-on-exec: EOF once the job execs
    try:
        try:
            proc = subprocess.Popen(
                list(argv),
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                preexec_fn=limit_address_space(limit_bytes, report_w, output_cap),
                pass_fds=pass_fds,
                user=None if run_as is None else run_as[0],
                group=None if run_as is None else run_as[1],
                extra_groups=None if run_as is None else [],
            )
        finally:
            os.close(report_w)
        report = os.read(report_r, 4096)
    finally:
        os.close(report_r)
    proc.returncode = 0  # subprocess must never wait for this pid: the caller reaps it
    return proc.pid, "" if report == b"ok" else report.decode(errors="replace") or "not confirmed"


def job_processes(run_id: str, attempt: int) -> list[int]:
    """Pids whose environment names this (run, attempt): the processes of a job whose
    executor died before it could record the pid. A scan of /proc: for rare paths only."""
    wanted = {f"CRONLOG_RUN_ID={run_id}".encode(), f"CRONLOG_ATTEMPT={attempt}".encode()}
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = set(f.read().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            found.append(int(entry.name))
    return found
