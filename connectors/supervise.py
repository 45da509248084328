"""The per-run supervisor: one small process that guards one run of a job on a worker.

Design section 4, point 5 (self-fencing workers): a worker that cannot renew its liveness
must kill its running jobs before the scheduler side declares it dead, and this must not
depend on the worker's main loop, because a paused (SIGSTOP) or wedged worker runs no loop.
So the worker starts every run through this supervisor, in a process of its own:

    python -m connectors.supervise --run-dir DIR --lease-file FILE --timeout-s T \\
        [--grace-s 5] [--memory-mb M] [--start-at-ms MS] -- argv...

The worker renews the *lease* after every heartbeat that was delivered: a small file that
holds one integer, the epoch-ms deadline until which the worker is known alive
(:func:`write_lease`). The supervisor kills the job once that deadline has passed, so the
worker must choose lease deadlines that, plus ``--grace-s``, end before the scheduler's
dead-timeout. A missing or unparsable lease file counts as expired, except during the
first :data:`LEASE_STARTUP_TOLERANCE_S` seconds of the supervisor's life (the worker writes
the lease before spawning, so normally it exists from the start).

What the supervisor does, in order:

1. Installs its signal handlers (SIGTERM, SIGINT and SIGHUP mean *cancel*), starts its own
   session (``os.setsid``; a no-op if the worker already spawned it with
   ``start_new_session=True``) so signals sent to the worker's process group do not reach
   it, and makes itself a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``) so orphaned
   descendants of the job become its children: it can kill them and it reaps them.
2. With ``--start-at-ms`` in the future, waits until then (pre-dispatch starts runs at
   their due time by this local timer), still watching the lease and cancel: a run fenced
   or cancelled before its start is never started (outcome ``fenced`` / ``cancelled``).
3. Starts the job without a shell: ``cwd`` is the run directory, stdin is ``/dev/null``,
   stdout and stderr are appended to ``run_dir/stdout`` and ``run_dir/stderr``, and the
   job leads a new session and process group. The environment passes through unchanged.
   With ``--memory-mb M`` the job's address space is limited to exactly M MiB
   (``RLIMIT_AS``, soft and hard, in the child before exec; never raised above an existing
   hard limit). A failure to set it does not stop the run; it is recorded
   (``rlimit_applied: false`` and ``rlimit_error``). ``RLIMIT_AS`` counts virtual memory,
   so M must leave room for the job's runtime (a bare CPython needs some 15-20 MiB).
4. Writes ``run_dir/started.json`` (``pid``, ``pgid``, ``started_ms``) once the job exists.
5. Every ~100 ms (and at once on SIGCHLD or a signal) checks, in this order: the job
   exited; cancel; lease expired (``fenced``); ``--timeout-s`` elapsed since the start
   (``timeout``).
6. Stops the job: SIGTERM to the job's process group (and to adopted descendants that left
   it), up to ``--grace-s`` seconds for all of them to go, then SIGKILL. This also happens
   after a normal exit when processes of the job are left behind, so that when the
   supervisor exits, nothing of the job is left running and no zombie of it is left.
7. Writes ``run_dir/result.json`` atomically (see :class:`RunResult`) and exits 0 if the
   job exited by itself with code 0, else 1. The worker reads ``result.json``, not the
   exit code. Command-line syntax errors exit 2 without a result; if the supervisor itself
   is killed (SIGKILL, OOM) there is no result either, and the worker must treat the run's
   process group (from ``started.json``) as possibly alive.

Linux only (uses ``/proc`` to find the processes of the job). Standard library only, so
the worker can import :func:`write_lease`, :func:`read_result`, :func:`read_started` and
:func:`supervise_command` cheaply.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Final, Literal

Outcome = Literal["exited", "timeout", "fenced", "cancelled", "error"]

STARTED_FILE: Final = "started.json"
RESULT_FILE: Final = "result.json"
STDOUT_FILE: Final = "stdout"
STDERR_FILE: Final = "stderr"

DEFAULT_GRACE_S: Final = 5.0
POLL_INTERVAL_S: Final = 0.1
# Missing or unparsable lease files count as expired only after this long.
LEASE_STARTUP_TOLERANCE_S: Final = 2.0
# After SIGKILL, how long to wait for the job's processes to disappear (they only linger
# in uninterruptible sleep) before giving up and reporting them.
KILL_WAIT_S: Final = 10.0
MIB: Final = 1024 * 1024

_PR_SET_CHILD_SUBREAPER: Final = 36
_CANCEL_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (the unit of leases and start times)."""
    return time.time_ns() // 1_000_000


# --------------------------------------------------------------------------------------
# Files shared with the worker


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a whole file so that readers see the old content or the new, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_json_atomic(path: Path, document: dict[str, object]) -> None:
    _write_atomic(path, (json.dumps(document, sort_keys=True) + "\n").encode())


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def write_lease(path: Path, deadline_ms: int) -> None:
    """Renew a lease: the worker is known alive until ``deadline_ms`` (epoch ms).

    Atomic (temporary file + ``os.replace`` in the same directory), so a supervisor never
    reads a torn value. Writing a deadline in the past fences every run guarded by it.
    """
    _write_atomic(path, f"{int(deadline_ms)}\n".encode())


def read_lease(path: Path) -> int | None:
    """The lease deadline in epoch ms, or None if the file is missing or unparsable."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, ValueError):
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def read_result(run_dir: Path) -> dict[str, object] | None:
    """``run_dir/result.json`` as written by the supervisor, or None if not there (yet)."""
    return _read_json(run_dir / RESULT_FILE)


def read_started(run_dir: Path) -> dict[str, object] | None:
    """``run_dir/started.json`` (``pid``, ``pgid``, ``started_ms``), or None if not there."""
    return _read_json(run_dir / STARTED_FILE)


def supervise_command(
    run_dir: Path,
    lease_file: Path,
    timeout_s: float,
    argv: Sequence[str],
    *,
    grace_s: float = DEFAULT_GRACE_S,
    memory_mb: int | None = None,
    start_at_ms: int | None = None,
    python: str = sys.executable,
) -> list[str]:
    """The command line that runs ``argv`` under the supervisor (spawn it with
    ``start_new_session=True`` and the job's environment)."""
    command = [
        python,
        "-m",
        "connectors.supervise",
        "--run-dir",
        str(run_dir),
        "--lease-file",
        str(lease_file),
        "--timeout-s",
        repr(float(timeout_s)),
        "--grace-s",
        repr(float(grace_s)),
    ]
    if memory_mb is not None:
        command += ["--memory-mb", str(int(memory_mb))]
    if start_at_ms is not None:
        command += ["--start-at-ms", str(int(start_at_ms))]
    return [*command, "--", *argv]


# --------------------------------------------------------------------------------------
# The result


@dataclass
class RunResult:
    """What ``result.json`` holds.

    ``exit_code`` is the job's exit status if it exited, ``signal`` the signal number that
    ended it otherwise (both None if it never started). ``outcome`` says why the run ended:
    ``exited`` (by itself, whatever its code), ``timeout``, ``fenced`` (lease expired),
    ``cancelled`` (the supervisor got SIGTERM/SIGINT/SIGHUP) or ``error`` (the job could
    not be started, or the supervisor failed; ``error`` says why). ``duration_ms`` runs
    from the start to the moment no process of the job was left (monotonic clock).
    """

    outcome: Outcome
    exit_code: int | None = None
    signal: int | None = None
    started_ms: int | None = None
    finished_ms: int = 0
    duration_ms: int | None = None
    error: str = ""
    rlimit_applied: bool = False
    rlimit_error: str = ""

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @property
    def exit_status(self) -> int:
        """The supervisor's own exit code."""
        return 0 if self.outcome == "exited" and self.exit_code == 0 else 1


# --------------------------------------------------------------------------------------
# Process plumbing


class _Signals:
    """Cancel signals and SIGCHLD, turned into a flag and a wake-up of :meth:`wait`."""

    def __init__(self) -> None:
        self.cancelled: int | None = None
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)

    def install(self) -> None:
        # Whatever the worker blocked or ignored, this process must see these signals
        # (an ignored SIGCHLD would even make the kernel reap the job behind our back).
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in _CANCEL_SIGNALS:
            signal.signal(signum, self._on_cancel)
        signal.signal(signal.SIGCHLD, self._on_child)

    def _on_cancel(self, signum: int, frame: FrameType | None) -> None:
        if self.cancelled is None:
            self.cancelled = signum

    def _on_child(self, signum: int, frame: FrameType | None) -> None:
        pass  # the wake-up fd has done the work

    def wait(self, timeout_s: float) -> None:
        """Sleep up to ``timeout_s``, waking early on any signal."""
        if timeout_s > 0:
            select.select([self._read_fd], [], [], timeout_s)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._read_fd, 4096):
                pass


def _new_session() -> str:
    """Leave the worker's session and process group; '' or why that was not possible."""
    if os.getsid(0) == os.getpid():
        return ""  # already a session leader (spawned with start_new_session=True)
    try:
        os.setsid()
    except OSError as exc:
        # Only a process-group leader gets EPERM here, and then our group is our own.
        return f"setsid failed: {exc}"
    return ""


def _become_subreaper() -> str:
    """Adopt orphaned descendants of the job (Linux); '' or why that was not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl(PR_SET_CHILD_SUBREAPER) unavailable: {exc}"
    return ""


def _limit_address_space(limit_bytes: int, report_fd: int) -> Callable[[], None]:
    """A ``preexec_fn`` that sets ``RLIMIT_AS`` and reports b'ok' or the error on a pipe."""

    def apply() -> None:
        try:
            _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
            value = limit_bytes if hard == resource.RLIM_INFINITY else min(limit_bytes, hard)
            resource.setrlimit(resource.RLIMIT_AS, (value, value))
            message = b"ok"
        except (OSError, ValueError) as exc:
            message = f"setrlimit(RLIMIT_AS, {limit_bytes}) failed: {exc}".encode()
        with contextlib.suppress(OSError):
            os.write(report_fd, message)

    return apply


@dataclass(frozen=True)
class _Proc:
    pid: int
    in_group: bool


def _job_processes(pgid: int, supervisor_pid: int, leader_pid: int) -> list[_Proc]:
    """Live (not zombie) processes of the job: its process group, plus descendants that
    left the group and were orphaned, which the subreaper supervisor has adopted."""
    found: list[_Proc] = []
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    raw = stat.read()
                # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
                state, ppid, pgrp = raw[raw.rindex(b")") + 2 :].split()[:3]
            except (OSError, ValueError):
                continue  # gone meanwhile
            if state in (b"Z", b"X", b"x"):
                continue
            pid = int(entry.name)
            if int(pgrp) == pgid:
                found.append(_Proc(pid, True))
            elif int(ppid) == supervisor_pid and pid != leader_pid:
                found.append(_Proc(pid, False))
    return found


def _decode_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from a wait status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


# --------------------------------------------------------------------------------------
# The supervisor


@dataclass(frozen=True)
class Options:
    run_dir: Path
    lease_file: Path
    timeout_s: float
    grace_s: float
    memory_mb: int | None
    start_at_ms: int | None
    argv: tuple[str, ...]


class Supervisor:
    """Runs one job to its end; :meth:`run` returns the result (never raises for the job)."""

    def __init__(self, options: Options, signals: _Signals, began_monotonic: float) -> None:
        self.options = options
        self.signals = signals
        self.began = began_monotonic
        self.my_pid = os.getpid()
        self.proc: subprocess.Popen[bytes] | None = None
        self.leader_status: int | None = None
        self.result = RunResult(outcome="error")

    # -- lease and reasons to stop ---------------------------------------------------

    def lease_expired(self) -> bool:
        deadline = read_lease(self.options.lease_file)
        if deadline is None:
            return time.monotonic() - self.began >= LEASE_STARTUP_TOLERANCE_S
        return now_ms() >= deadline

    def _stop_reason(self) -> Outcome | None:
        if self.signals.cancelled is not None:
            return "cancelled"
        if self.lease_expired():
            return "fenced"
        return None

    # -- phases ----------------------------------------------------------------------

    def run(self) -> RunResult:
        reason = self._wait_for_start()
        if reason is not None:
            self.result.outcome = reason
            self.result.error = _describe(reason, self.signals.cancelled, started=False)
            return self._finish(None)
        start_monotonic = time.monotonic()
        self.result.started_ms = now_ms()
        try:
            self._spawn()
        except OSError as exc:
            self.result.started_ms = None
            self.result.error = f"cannot start {self.options.argv[0]!r}: {exc}"
            return self._finish(None)
        try:
            assert self.proc is not None
            pid = self.proc.pid
            try:
                pgid = os.getpgid(pid)
            except OSError:
                pgid = pid  # start_new_session=True: the job leads its own group
            _write_json_atomic(
                self.options.run_dir / STARTED_FILE,
                {"pid": pid, "pgid": pgid, "started_ms": self.result.started_ms},
            )
            reason = self._watch(start_monotonic)
            if reason is not None:
                self.result.error = _describe(reason, self.signals.cancelled, started=True)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the job must not outlive us
            reason = "error"
            self.result.error = f"supervisor failed: {type(exc).__name__}: {exc}"
        self.result.outcome = reason or "exited"
        leftovers = self._stop_job()
        self._reap_leader()
        self._reap_adopted()
        if leftovers:
            note = f"processes of the job still present after SIGKILL: {leftovers}"
            self.result.error = f"{self.result.error}; {note}" if self.result.error else note
        if self.leader_status is not None:
            self.result.exit_code, self.result.signal = _decode_status(self.leader_status)
        return self._finish(start_monotonic)

    def _wait_for_start(self) -> Outcome | None:
        start_at = self.options.start_at_ms
        while True:
            reason = self._stop_reason()
            if reason is not None:
                return reason
            if start_at is None:
                return None
            remaining_ms = start_at - now_ms()
            if remaining_ms <= 0:
                return None
            self.signals.wait(min(POLL_INTERVAL_S, remaining_ms / 1000))

    def _spawn(self) -> None:
        options = self.options
        memory = options.memory_mb
        report_read = report_write = -1
        preexec: Callable[[], None] | None = None
        if memory is not None:
            report_read, report_write = os.pipe()  # close-on-exec: EOF once the job execs
            preexec = _limit_address_space(memory * MIB, report_write)
        try:
            try:
                with (
                    open(options.run_dir / STDOUT_FILE, "ab") as stdout,
                    open(options.run_dir / STDERR_FILE, "ab") as stderr,
                ):
                    self.proc = subprocess.Popen(
                        list(options.argv),
                        cwd=options.run_dir,
                        stdin=subprocess.DEVNULL,
                        stdout=stdout,
                        stderr=stderr,
                        start_new_session=True,
                        preexec_fn=preexec,
                    )
            finally:
                if report_write >= 0:
                    os.close(report_write)
            if report_read >= 0:
                # Popen returned, so the child has exec'd: its end of the pipe is closed.
                report = os.read(report_read, 4096)
                self.result.rlimit_applied = report == b"ok"
                if not self.result.rlimit_applied:
                    self.result.rlimit_error = report.decode(errors="replace") or (
                        "the limit was not confirmed by the child"
                    )
        finally:
            if report_read >= 0:
                os.close(report_read)

    def _watch(self, start_monotonic: float) -> Outcome | None:
        deadline = start_monotonic + self.options.timeout_s
        while True:
            if self._poll_children():
                return None
            reason = self._stop_reason()
            if reason is not None:
                return reason
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            self.signals.wait(min(POLL_INTERVAL_S, left))

    def _poll_children(self) -> bool:
        """Reap adopted orphans that exited; True once the job's leader has exited.

        The leader is left unreaped (a zombie) until the end, so its pid, and with it the
        job's process-group id, cannot be reused while we still signal the group.
        """
        assert self.proc is not None
        while True:
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return True
            if info is None:
                return False
            if info.si_pid == self.proc.pid:
                return True
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)

    def _stop_job(self) -> list[int]:
        """SIGTERM, grace, SIGKILL to every live process of the job; the pids still alive
        after SIGKILL and :data:`KILL_WAIT_S` (normally none)."""
        if self.proc is None:
            return []
        pgid = self.proc.pid
        grace_end = time.monotonic() + self.options.grace_s
        kill_end: float | None = None
        termed: set[int] = set()
        term_group = False
        while True:
            self._reap_adopted_zombies()
            alive = _job_processes(pgid, self.my_pid, self.proc.pid)
            if not alive:
                return []
            now = time.monotonic()
            if kill_end is None and now >= grace_end:
                kill_end = now + KILL_WAIT_S
            if kill_end is not None and now >= kill_end:
                return sorted(p.pid for p in alive)
            # SIGTERM once to each; SIGKILL on every round (catches late forks). SIGCONT
            # after SIGTERM, so that stopped processes can act on it.
            sig = signal.SIGTERM if kill_end is None else signal.SIGKILL
            targets: list[tuple[int, bool]] = []
            if any(p.in_group for p in alive) and (sig == signal.SIGKILL or not term_group):
                targets.append((pgid, True))
                term_group = True
            targets += [
                (p.pid, False)
                for p in alive
                if not p.in_group and (sig == signal.SIGKILL or p.pid not in termed)
            ]
            for target, group in targets:
                send = os.killpg if group else os.kill
                for each in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        send(target, each)
                if not group:
                    termed.add(target)
            if kill_end is None:
                self.signals.wait(min(POLL_INTERVAL_S, max(grace_end - now, 0.001)))
            else:
                self.signals.wait(0.02)

    def _reap_adopted_zombies(self) -> None:
        """Reap exited children other than the leader (without reaping the leader)."""
        assert self.proc is not None
        for _ in range(10_000):
            try:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                return
            if info is None:
                return
            if info.si_pid == self.proc.pid:
                # The leader blocks the view of other zombies; scan for them instead.
                for pid in _zombie_children(self.my_pid, self.proc.pid):
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)

    def _reap_leader(self) -> None:
        if self.proc is None or self.leader_status is not None:
            return
        pid = self.proc.pid
        try:
            waited, status = os.waitpid(pid, os.WNOHANG)
            if waited == 0:  # only if processes were left even after SIGKILL
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
        except ChildProcessError:
            return
        self.leader_status = status
        # Tell the Popen object, so it never waits for the pid again.
        self.proc.returncode = os.waitstatus_to_exitcode(status)

    def _reap_adopted(self) -> None:
        """Reap every remaining child (all adopted descendants, all dead by now)."""
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _finish(self, start_monotonic: float | None) -> RunResult:
        self.result.finished_ms = now_ms()
        if start_monotonic is not None:
            self.result.duration_ms = round((time.monotonic() - start_monotonic) * 1000)
        return self.result


def _zombie_children(supervisor_pid: int, leader_pid: int) -> list[int]:
    zombies: list[int] = []
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == leader_pid:
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as stat:
                    raw = stat.read()
                state, ppid = raw[raw.rindex(b")") + 2 :].split()[:2]
            except (OSError, ValueError):
                continue
            if state == b"Z" and int(ppid) == supervisor_pid:
                zombies.append(int(entry.name))
    return zombies


def _describe(reason: Outcome, cancel_signal: int | None, *, started: bool) -> str:
    when = "" if started else " before the job was started"
    if reason == "cancelled":
        name = signal.Signals(cancel_signal).name if cancel_signal else "a signal"
        return f"cancelled by {name}{when}"
    if reason == "fenced":
        return f"lease expired{when}"
    if reason == "timeout":
        return "timed out"
    return ""


# --------------------------------------------------------------------------------------
# Command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m connectors.supervise",
        description="Run one job under a lease, a timeout and cancel; see the module doc.",
        usage="%(prog)s --run-dir DIR --lease-file FILE --timeout-s T [--grace-s S] "
        "[--memory-mb M] [--start-at-ms MS] -- argv...",
    )
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--lease-file", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--grace-s", type=float, default=DEFAULT_GRACE_S)
    parser.add_argument("--memory-mb", type=int, default=None)
    parser.add_argument("--start-at-ms", type=int, default=None)
    return parser


def _parse(args: Sequence[str]) -> tuple[Options, str]:
    """Options and a validation error ('' if none). Syntax errors exit 2 (argparse)."""
    parser = _parser()
    if "--" in args:
        split = list(args).index("--")
        own, argv = list(args[:split]), tuple(args[split + 1 :])
    else:
        own, argv = list(args), ()
    namespace = parser.parse_args(own)
    options = Options(
        run_dir=Path(namespace.run_dir).absolute(),
        lease_file=Path(namespace.lease_file).absolute(),
        timeout_s=namespace.timeout_s,
        grace_s=namespace.grace_s,
        memory_mb=namespace.memory_mb,
        start_at_ms=namespace.start_at_ms,
        argv=argv,
    )
    problems = []
    if not argv or not argv[0]:
        problems.append("no command given after '--'")
    if not (math.isfinite(options.timeout_s) and options.timeout_s > 0):
        problems.append("--timeout-s must be a positive number")
    if not (math.isfinite(options.grace_s) and options.grace_s >= 0):
        problems.append("--grace-s must be a non-negative number")
    if options.memory_mb is not None and options.memory_mb <= 0:
        problems.append("--memory-mb must be positive")
    return options, "; ".join(problems)


def main(args: Sequence[str] | None = None) -> int:
    began = time.monotonic()
    signals = _Signals()
    signals.install()
    for warning in (_new_session(), _become_subreaper()):
        if warning:
            print(f"supervise: warning: {warning}", file=sys.stderr)
    options, problem = _parse(sys.argv[1:] if args is None else args)
    try:
        options.run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"supervise: cannot create the run directory: {exc}", file=sys.stderr)
        return 1
    if problem:
        result = RunResult(outcome="error", error=problem, finished_ms=now_ms())
    else:
        result = Supervisor(options, signals, began).run()
    try:
        _write_json_atomic(options.run_dir / RESULT_FILE, result.to_json())
    except OSError as exc:
        print(f"supervise: cannot write {RESULT_FILE}: {exc}", file=sys.stderr)
        return 1
    if result.outcome == "error":
        print(f"supervise: {result.error}", file=sys.stderr)
    return result.exit_status


if __name__ == "__main__":
    sys.exit(main())
