"""The executor process: one long-lived process per worker incarnation runs every job.

    python -m connectors.worker.engine --lease-file FILE --log FILE [--cpu C ...]

Why one process and not a supervisor per run: a Python interpreter per run costs tens of
milliseconds of CPU, a fork/exec of the job itself about one (docs/performance.md, "Real
processes", has the figures), so a machine's start rate is the jobs' own. This process
starts jobs directly, each leading its own session and process group, and watches all of
them in one loop: child exits (SIGCHLD), start times, timeouts and the lease.

Why a process apart from the worker's main process: self-fencing must not depend on the
worker's loop. A worker that is SIGKILLed, SIGSTOPped or wedged stops renewing the lease,
and this process kills every job group once the lease has expired (within the loop's
0.1 s tick plus the grace). It is in its own session, so signals to the worker's process
group do not reach it. If this process itself is stopped for longer than `--max-gap-s`
it can no longer vouch that the lease held the whole time (the failure detector may have
declared the worker dead meanwhile), so it fences everything when it runs again. If it is
killed, the worker notices (its pipe closes) and kills the job groups it was told about.

Protocol (JSON lines). The worker writes to stdin:
  {"op": "start", "key": [run_id, attempt], "run_dir", "argv", "env", "timeout_s",
   "memory_mb", "start_at_ms", "start_at_mono", "need": [cpu, memory_mb, gpu]}
  {"op": "cancel", "key": [...]}
  {"op": "clock", "clock": [base, rate_ms]}
A run starts at `start_at_mono`, an instant of CLOCK_MONOTONIC (system-wide on Linux):
the worker translates the run's start time, which is broker time, into it with its
broker clock (streams/core/clock.py), so a wrong wall clock cannot start a run early.
With "clock" (the worker's broker clock's bound, in a start op and alone whenever it
moves), `start_at_ms` is that broker time and the run starts when the newest bound
reaches it: the bound carried forward from the hand-over loses up to 1 ms a second,
which a burst's runs, handed over minutes ahead, would start late by. Without either,
`start_at_ms` is a time on this machine's wall clock, translated on receipt.
This process writes to stdout, and appends to `--log` (so a restarted worker can read the
outcome of what an earlier incarnation ran):
  {"ev": "started", "key", "pid", "started_ms", "started_mono"}
  {"ev": "finished", "key", "result": {outcome, exit_code, signal, started_ms,
   finished_ms, started_mono, finished_mono, error, [output_cut]}}
  {"ev": "tick"} every half second (the worker's sign that this process is alive).
Times come twice: epoch ms of this machine's wall clock, and CLOCK_MONOTONIC seconds,
which the worker turns into broker time for its reports.
Outcomes: exited (by itself, any code), timeout, cancelled, fenced (lease expired after
the start), error (could not start), not_started (never started and never will be:
fenced, cancelled, or no room within `--start-wait-s` of its start time, or the worker
went away before its time; the worker releases such a run for dispatch).

The lease file holds a deadline on CLOCK_MONOTONIC and the start horizon of the beat
that renewed it, `monotonic SECONDS [ARMED_MS]` (`lease_text`; the worker's heartbeat
thread writes it): a run starts only while the lease holds and its start time (broker
ms) is at most the horizon, so no start is made that no acknowledged beat armed (the
dead worker's verdict releases what is later). The worker measures its lease against itself,
and a step of the wall clock (NTP) neither stretches it (a cut-off worker's jobs would
outlive the failure detector's verdict) nor cuts it short. A bare integer is the
wall-clock form (`lease.write_lease`, epoch ms), still honoured.

A run handed over before its time has its directory and output files made while it waits
(`_prepare_ahead`), so that the starts of a burst are spawns only.

Resources at the start: a run whose start time has come starts only if what the running
jobs reserve leaves room for it (cpu, memory, gpu of the worker); otherwise it waits, in
order of start time, until enough of them end. Memory is limited per job by RLIMIT_AS
(address space, not resident memory: JVM and Go runtimes reserve far more address space
than they use, so give them a generous `memory_mb`); cgroup v2 memory.max would be exact
but needs a delegated hierarchy, which the machines this was built on do not have.

Job processes that leave their process group (setsid, daemonising) are not killed with
it; they are reaped here (this process is a child subreaper) but not tracked. Under
bubblewrap (connectors/worker/confine.py) they are: the job has a PID namespace of its
own, whose init is in the group, and the kernel kills all of a namespace with its init.

No file a job writes grows past the output cap (`--output-cap-mb`, RLIMIT_FSIZE,
connectors/worker/outputcap.py); a run whose stdout or stderr reached it ends with
`output_cut` in its result, saying so.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import math
import os
import selectors
import signal
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from connectors.worker.confine import DEFAULT_TMPFS_BYTES, Confinement
from connectors.worker.lease import read_lease
from connectors.worker.outputcap import (
    DEFAULT_OUTPUT_CAP_MB,
    cut_streams,
    reason,
    spawn_by_fork,
)
from connectors.worker.procs import (
    become_subreaper,
    conceal,
    decode_status,
    group_alive,
    signal_group,
    spawn,
    spawn_limited,
)
from connectors.worker.rundirs import RunDirError, prepare, reopen

Key = tuple[str, int]
MIB: Final = 1024 * 1024
TICK_S: Final = 0.1
ALIVE_EVERY_S: Final = 0.5
KILL_WAIT_S: Final = 10.0  # after SIGKILL, how long to wait for a group to disappear
STEP_BUDGET_S: Final = 0.05  # spawning in one pass of the loop, at most
# Making directories ahead of their starts in one pass, at most: it never delays a start
# due (that pass's starts come first) by more than this.
PREPARE_BUDGET_S: Final = 0.02


def now_ms() -> int:
    return time.time_ns() // 1_000_000


MONOTONIC_LEASE: Final = "monotonic"


def lease_text(
    deadline_mono: float, armed_ms: int | None = None, renewed_mono: float = 0.0
) -> bytes:
    """A lease alive until `deadline_mono` on CLOCK_MONOTONIC (what the worker writes),
    with the start horizon of the beat that renewed it (broker ms), if it has one, and
    when it was last renewed after a lapse (`Lease.renewed_mono`; 0: never lapsed)."""
    armed = "-" if armed_ms is None else str(armed_ms)
    return f"{MONOTONIC_LEASE} {deadline_mono:.6f} {armed} {renewed_mono:.6f}\n".encode("ascii")


@dataclass(frozen=True, slots=True)
class Lease:
    """What the lease file says now: whether it holds, and up to which start time
    (broker ms) runs may start (None: no horizon, the lease alone bounds the starts)."""

    holds: bool
    armed_ms: int | None = None
    # When the lease was renewed after it had lapsed (CLOCK_MONOTONIC; 0: never). While
    # it lapsed the failure detector may have declared the worker dead and ended every
    # claim it held, so a claim made before this is void: its grant, however late it
    # comes, starts nothing (`voids`).
    renewed_mono: float = 0.0

    def arms(self, start_at_ms: int) -> bool:
        return self.holds and (self.armed_ms is None or start_at_ms <= self.armed_ms)

    def voids(self, claimed_mono: float | None) -> bool:
        """Whether a claim made at `claimed_mono` (None: not known) predates a lapse."""
        return claimed_mono is not None and claimed_mono < self.renewed_mono


def read_lease_file(path: Path) -> Lease:
    """The lease in `path`: a monotonic deadline and maybe a horizon (`lease_text`), or
    an epoch-ms deadline on the wall clock (`lease.write_lease`). Missing or unreadable:
    not alive."""
    try:
        words = path.read_text(encoding="ascii").split()
    except (OSError, UnicodeDecodeError):
        return Lease(False)
    try:
        if len(words) in (2, 3, 4) and words[0] == MONOTONIC_LEASE:
            armed = int(words[2]) if len(words) >= 3 and words[2] != "-" else None
            renewed = float(words[3]) if len(words) == 4 else 0.0
            return Lease(time.monotonic() < float(words[1]), armed, renewed)
    except ValueError:
        return Lease(False)
    deadline = read_lease(path)
    return Lease(deadline is not None and now_ms() < deadline)


def cannot_start(program: str, path: str | None, exc: Exception) -> str:
    """Why a job's program did not start, in words a user acts on: a name not found on
    the job's PATH says which PATH (the job's `env` may set another); a program the
    job's user may not run says so; anything else as the system put it."""
    missing = isinstance(exc, FileNotFoundError) and exc.filename == program
    if missing and "/" not in program:
        return f"cannot start {program!r}: not found on PATH ({path or 'none set'})"
    if missing:
        return f"cannot start {program!r}: no such file"
    if isinstance(exc, PermissionError):
        return (
            f"cannot start {program!r}: permission denied (the job's user may not run it, "
            "or may not enter a directory on its way)"
        )
    return f"cannot start {program!r}: {exc}"


def lease_holds(path: Path) -> bool:
    """Whether the lease in `path` is alive now."""
    return read_lease_file(path).holds


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    """The executor process's options (its command line)."""

    lease_file: Path
    log_file: Path
    capacity: tuple[float, float, float] = (float("inf"), float("inf"), float("inf"))
    grace_s: float = 1.0
    max_gap_s: float = 2.5
    start_wait_s: float = 30.0
    run_as: tuple[int, int] | None = None  # (uid, gid) every job runs as (`--run-as`)
    # The sandbox jobs run in (connectors/worker/confine.py): the worker's files hidden,
    # a PID namespace and a /tmp of their own, their environment applied inside only.
    confinement: Confinement | None = None
    # No file a job writes grows past this (RLIMIT_FSIZE), its output files included
    # (connectors/worker/outputcap.py); 0: no cap.
    output_cap: int = DEFAULT_OUTPUT_CAP_MB * MIB


@dataclass
class Job:
    key: Key
    run_dir: Path
    argv: list[str]
    env: dict[str, str]
    timeout_s: float
    memory_mb: int
    start_at_ms: int
    need: tuple[float, float, float]
    start_mono: float = 0.0  # when it may start, on CLOCK_MONOTONIC
    state: str = "pending"  # pending | queued | running | stopping
    pid: int = 0
    started_ms: int | None = None
    started_mono: float | None = None
    queued_mono: float = 0.0
    status: int | None = None  # the leader's wait status, once reaped
    outcome: str = ""
    error: str = ""
    kill_at: float = 0.0  # monotonic: SIGKILL from then on
    give_up_at: float = 0.0
    rlimit_error: str = ""
    # Its directory made ahead of its start (`_prepare_ahead`), or why that failed.
    prepared: bool = False
    prepare_error: str = ""
    # When the worker claimed it (CLOCK_MONOTONIC; None: not said): void if the lease
    # lapsed after that (`Lease.voids`).
    claimed_mono: float | None = None


class ExecutorLoop:
    """The executor process's one loop: every job of the worker, its start, room,
    timeout and lease."""

    def __init__(self, config: ExecutorConfig, out_fd: int = 1, in_fd: int = 0) -> None:
        self.config = config
        self.jobs: dict[Key, Job] = {}
        self.by_pid: dict[int, Job] = {}
        self.starts: list[tuple[float, Key]] = []  # (monotonic start, key) heap
        # Runs timed by the worker's broker clock: (start time in broker ms, key), a heap,
        # and that clock's newest bound (base, rate_ms): broker ms >= base + rate_ms * mono.
        self.timed: list[tuple[int, Key]] = []
        self.clock = (-math.inf, 1000.0)
        self.timeouts: list[tuple[float, Key]] = []  # (monotonic deadline, key) heap
        self.queue: deque[Key] = deque()  # due, waiting for room
        self.unprepared: deque[Key] = deque()  # pending, their directories not made yet
        self.stopping: set[Key] = set()  # being killed: checked every pass
        self.more = False  # due runs left for the next pass (the budget ran out)
        self.in_use = [0.0, 0.0, 0.0]
        self.in_fd, self.out_fd = in_fd, out_fd
        self.inbuf = b""
        self.outbuf = bytearray()
        self.orphaned = False  # the worker went away
        self.stopping_all = ""
        # Unbuffered: every line is in the file (the OS's) the moment it is written, so
        # a SIGKILL of this process loses none of them.
        self.log = open(config.log_file, "ab", buffering=0)  # noqa: SIM115
        self.last_loop = time.monotonic()
        self.last_alive = 0.0
        self.last_lease_check = 0.0
        self.lease_ok = False
        self.lease_seen = False  # the lease was valid once: from then on, invalid = expired
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w, in_fd, out_fd):
            os.set_blocking(fd, False)

    # -- setup ---------------------------------------------------------------------------
    def install_signals(self) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_stop)

    def _on_stop(self, signum: int, _frame: object) -> None:
        self.stopping_all = f"the executor got {signal.Signals(signum).name}"

    # -- the loop ------------------------------------------------------------------------
    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.in_fd, selectors.EVENT_READ, "in")
        selector.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            for key, _ in selector.select(self._sleep_s()):
                if key.data == "in":
                    self._read_input(selector)
                else:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 4096):
                            pass
            self.step()
            if (self.orphaned or self.stopping_all) and not self.jobs:
                self._flush(final=True)
                return

    def _sleep_s(self) -> float:
        if self.more:
            return 0.0
        sleep = TICK_S
        if not self.lease_ok:
            # Nothing starts without a lease: the start heaps' heads (a fenced run's, its
            # time passed) must not turn the wait into a spin until one comes.
            return sleep
        if self.starts:
            sleep = min(sleep, max(0.0, self.starts[0][0] - time.monotonic()))
        if self.timed:
            sleep = min(sleep, max(0.0, self._timed_mono(self.timed[0][0]) - time.monotonic()))
        return sleep

    def _timed_mono(self, broker_ms: int) -> float:
        """When the worker's broker clock, as last told, reaches `broker_ms` (on
        CLOCK_MONOTONIC; a microsecond late against rounding, as `BrokerClock.mono_at`)."""
        base, rate_ms = self.clock
        return (broker_ms - base) / rate_ms + 1e-6

    def _clock_told(self, bound: Any) -> None:
        """The worker's broker clock moved: its bound only rises (a late op is ignored)."""
        base, rate_ms = float(bound[0]), float(bound[1])
        if base > self.clock[0] and rate_ms > 0:
            self.clock = (base, rate_ms)

    def step(self) -> None:
        """One pass: reap, check the lease, start what is due, enforce timeouts, stop."""
        self.more = False  # set again by _start_due if its budget runs out
        mono = time.monotonic()
        gap = mono - self.last_loop
        self.last_loop = mono
        self._reap()
        if gap > self.config.max_gap_s:
            self._fence_all(f"the executor did not run for {gap:.1f} s: lease not proven")
        elif self.stopping_all:
            self._fence_all(self.stopping_all, outcome="fenced")
        elif self._lease_valid(mono):
            self._start_due(mono)
            if not self.more:
                self._prepare_ahead()
        elif self.lease_seen:
            self._fence_all("lease expired")
        # else: no heartbeat acknowledged yet; nothing starts until one is
        self._enforce_timeouts(mono)
        self._progress_stops(mono)
        if mono - self.last_alive >= ALIVE_EVERY_S:
            self.last_alive = mono
            self._emit({"ev": "tick"}, log=False)
        self._flush()

    def _armed_now(self, job: Job, pass_began: float) -> bool:
        """Checked right before each start: the lease read now (not the pass's cached
        answer) is valid and a beat Kafka acknowledged armed the run's start time, and
        this pass has not itself been stalled long enough for the failure detector to
        have given up on the worker meanwhile. Arming is why a dead worker's verdict can
        tell the runs it never started: a later start time than the horizon of its last
        beat the broker holds."""
        if time.monotonic() - pass_began > self.config.max_gap_s:
            return False
        lease = read_lease_file(self.config.lease_file)
        if lease.holds and lease.voids(job.claimed_mono):
            self._finish(
                job,
                "not_started",
                "the lease lapsed after its claim (the worker may have been declared dead "
                "meanwhile, which ended the claim)",
            )
            return True  # ended, not started: out of the way of the runs behind it
        return lease.arms(job.start_at_ms)

    def _lease_valid(self, mono: float) -> bool:
        if mono - self.last_lease_check >= TICK_S or not self.lease_ok:
            self.lease_ok = lease_holds(self.config.lease_file)
            self.lease_seen = self.lease_seen or self.lease_ok
            self.last_lease_check = mono
        return self.lease_ok

    # -- input ---------------------------------------------------------------------------
    def _read_input(self, selector: selectors.BaseSelector) -> None:
        try:
            data = os.read(self.in_fd, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            selector.unregister(self.in_fd)
            self._orphan()
            return
        lines = (self.inbuf + data).split(b"\n")
        self.inbuf = lines.pop()
        for line in lines:
            if line:
                self.handle(orjson.loads(line))

    def handle(self, op: dict[str, Any]) -> None:
        if op["op"] == "clock":
            self._clock_told(op["clock"])
            return
        key: Key = (op["key"][0], int(op["key"][1]))
        if op["op"] == "start":
            if key in self.jobs:
                return
            job = Job(
                key,
                Path(op["run_dir"]),
                list(op["argv"]),
                dict(op["env"]),
                float(op["timeout_s"]),
                int(op.get("memory_mb") or 0),
                int(op["start_at_ms"]),
                _vector(op.get("need")),
                _start_mono(op),
                claimed_mono=None if op.get("claimed_mono") is None else float(op["claimed_mono"]),
            )
            self.jobs[key] = job
            if self.orphaned or self.stopping_all:
                self._finish(job, "not_started", "the worker is going away")
                return
            if op.get("clock") is not None and op.get("start_at_mono") is not None:
                # Its start time is broker time: it starts when the newest bound of the
                # worker's clock reaches it, which is never later than `start_at_mono`
                # (translated at the hand-over, when the bound was older).
                self._clock_told(op["clock"])
                heapq.heappush(self.timed, (job.start_at_ms, key))
            else:
                heapq.heappush(self.starts, (job.start_mono, key))
            self.unprepared.append(key)
        elif op["op"] == "cancel":
            held = self.jobs.get(key)
            if held is None:
                return
            if held.state in ("pending", "queued"):
                self._finish(held, "not_started", "cancelled before the start")
            elif held.state == "running":
                self._stop(held, "cancelled", "cancelled")

    def _orphan(self) -> None:
        """The worker is gone: start nothing more; running jobs live until the lease ends
        (nobody renews it now), then they are fenced like any others."""
        self.orphaned = True
        for job in list(self.jobs.values()):
            if job.state in ("pending", "queued"):
                self._finish(job, "not_started", "the worker went away before its start")

    # -- starting ------------------------------------------------------------------------
    def _start_due(self, mono: float) -> None:
        now = time.monotonic()
        due = []
        while self.starts and self.starts[0][0] <= now:
            due.append(heapq.heappop(self.starts)[1])
        while self.timed and self._timed_mono(self.timed[0][0]) <= now:
            due.append(heapq.heappop(self.timed)[1])
        for key in due:
            job = self.jobs.get(key)
            if job is not None and job.state == "pending":
                job.state, job.queued_mono = "queued", mono
                self.queue.append(key)
        while self.queue:
            job = self.jobs.get(self.queue[0])
            if job is None or job.state != "queued":
                self.queue.popleft()
                continue
            if not self._room_for(job.need):
                if mono - job.queued_mono > self.config.start_wait_s:
                    self.queue.popleft()
                    self._finish(
                        job,
                        "not_started",
                        f"no room on the worker within {self.config.start_wait_s:g} s "
                        "of its start time",
                    )
                    continue
                return  # in order: the head waits for room, the others behind it
            if not self._armed_now(job, mono):
                # The next pass fences, or waits for a first lease or for the beat that
                # arms this start (the queue is in start order: the others wait too).
                return
            self.queue.popleft()
            if job.key not in self.jobs:
                continue  # `_armed_now` ended it: its claim predates a lapse of the lease
            self._spawn(job, mono)
            if time.monotonic() - mono > STEP_BUDGET_S:
                # A burst of thousands due at once must not hold the loop for seconds:
                # reaping, the lease, timeouts and the sign of life come first.
                self.more = True
                return

    def _prepare_ahead(self) -> None:
        """Make the directories and output files of runs not due yet, so that a burst's
        starts are spawns only: on the machines this was measured on, making a file or
        a directory costs about as much CPU as the fork and exec of `sh`
        (docs/performance.md, "Real processes"). A run whose start comes first is
        prepared at its start, as before. A run that never starts leaves its directory
        to the worker, which removes it with the release."""
        began = time.monotonic()
        while self.unprepared and time.monotonic() - began < PREPARE_BUDGET_S:
            job = self.jobs.get(self.unprepared.popleft())
            if job is None or job.state != "pending":
                continue
            try:
                # The worker's alone until the start (`reopen` hands `work/` over then).
                prepare(job.run_dir, None).close()
            except OSError as exc:
                job.prepare_error = str(exc)  # the start fails with it
            else:
                job.prepared = True
        if self.unprepared:
            self.more = True

    def _room_for(self, need: tuple[float, float, float]) -> bool:
        # A job larger than the whole worker is started alone rather than never.
        nothing_runs = not any(self.in_use)
        return nothing_runs or all(
            u + n <= c + 1e-9
            for u, n, c in zip(self.in_use, need, self.config.capacity, strict=True)
        )

    def _spawn(self, job: Job, mono: float) -> None:
        # The intent first: if this process dies between the spawn and the "started"
        # line, the worker knows the job may exist and must not release the run.
        self.log.write(orjson.dumps({"ev": "starting", "key": job.key}) + b"\n")
        run_as = self.config.run_as
        try:
            # Its directory and output files, made before the job exists; as another
            # user it owns its working directory only (connectors/worker/rundirs.py).
            if job.prepare_error:
                raise RunDirError(job.prepare_error)
            made = reopen(job.run_dir, run_as) if job.prepared else prepare(job.run_dir, run_as)
            argv, env, sandbox = job.argv, job.env, None
            cap = self.config.output_cap
            try:
                if self.config.confinement is not None:
                    # bwrap gets an environment of its own; the job's is applied inside
                    # the sandbox, from a descriptor (connectors/worker/confine.py).
                    sandbox = self.config.confinement.wrap(argv, made.work, job.env)
                    argv, env = sandbox.argv, sandbox.env
                if run_as is not None or job.memory_mb > 0 or spawn_by_fork(cap):
                    pid, job.rlimit_error = spawn_limited(
                        argv,
                        env,
                        made.work,
                        made.stdout,
                        made.stderr,
                        job.memory_mb * MIB,
                        run_as,
                        cap,
                        () if sandbox is None else (sandbox.args_fd,),
                    )
                else:
                    pid = spawn(argv, env, made.work, made.stdout, made.stderr, cap)
            finally:
                made.close()
                if sandbox is not None:
                    sandbox.close()
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            self._finish(job, "error", cannot_start(job.argv[0], job.env.get("PATH"), exc))
            return
        job.pid, job.state = pid, "running"
        job.started_ms, job.started_mono = now_ms(), time.monotonic()
        for i, n in enumerate(job.need):
            self.in_use[i] += n
        self.by_pid[pid] = job
        heapq.heappush(self.timeouts, (mono + job.timeout_s, job.key))
        if len(self.timeouts) > 2 * len(self.jobs) + 1000:
            # Entries of finished jobs stay until their time: an hour of them at
            # hundreds of runs a second would be millions. Keep the live ones only.
            self.timeouts = [t for t in self.timeouts if t[1] in self.jobs]
            heapq.heapify(self.timeouts)
        self._emit(
            {
                "ev": "started",
                "key": job.key,
                "pid": job.pid,
                "started_ms": job.started_ms,
                "started_mono": job.started_mono,
            }
        )

    # -- watching ------------------------------------------------------------------------
    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.by_pid.pop(pid, None)
            if job is None:
                continue  # an adopted orphan of some job
            job.status = status
            if job.state == "running":
                # The leader is gone. Processes it left in its group are stopped too; the
                # group's id cannot be reused while any member lives.
                if group_alive(job.pid):
                    self._stop(job, "exited", "")
                else:
                    self._finish(job, "exited", "")

    def _enforce_timeouts(self, mono: float) -> None:
        while self.timeouts and self.timeouts[0][0] <= mono:
            _, key = heapq.heappop(self.timeouts)
            job = self.jobs.get(key)
            if job is not None and job.state == "running":
                self._stop(job, "timeout", "timed out")

    def _fence_all(self, why: str, outcome: str = "fenced") -> None:
        for job in list(self.jobs.values()):
            if job.state in ("pending", "queued"):
                self._finish(job, "not_started", f"{why} before the start")
            elif job.state == "running":
                self._stop(job, outcome, why)

    def _stop(self, job: Job, outcome: str, error: str) -> None:
        """SIGTERM to the job's group now, SIGKILL after the grace."""
        job.state, job.outcome, job.error = "stopping", outcome, error
        self.stopping.add(job.key)
        mono = time.monotonic()
        job.kill_at = mono + self.config.grace_s
        job.give_up_at = job.kill_at + KILL_WAIT_S
        signal_group(job.pid, signal.SIGTERM)

    def _progress_stops(self, mono: float) -> None:
        for job in [self.jobs[k] for k in list(self.stopping)]:
            if job.status is not None and not group_alive(job.pid):
                self._finish(job, job.outcome, job.error)
            elif mono >= job.give_up_at:
                note = f"processes of group {job.pid} still present after SIGKILL"
                self._finish(job, job.outcome, f"{job.error}; {note}" if job.error else note)
            elif mono >= job.kill_at:
                signal_group(job.pid, signal.SIGKILL)

    def _finish(self, job: Job, outcome: str, error: str) -> None:
        if job.state in ("running", "stopping"):
            for i, n in enumerate(job.need):
                self.in_use[i] = max(0.0, self.in_use[i] - n)
        exit_code, sig = decode_status(job.status) if job.status is not None else (None, None)
        if job.rlimit_error:
            note = f"limits not applied: {job.rlimit_error}"
            error = f"{error}; {note}" if error else note
        cut = [] if job.started_ms is None else cut_streams(job.run_dir, self.config.output_cap)
        result = {
            "outcome": outcome,
            "exit_code": exit_code,
            "signal": sig,
            "started_ms": job.started_ms,
            "finished_ms": now_ms(),
            "started_mono": job.started_mono,
            "finished_mono": time.monotonic(),
            "error": error,
        }
        if cut:
            result["output_cut"] = reason(cut, self.config.output_cap)
        del self.jobs[job.key]
        self.stopping.discard(job.key)
        self._emit({"ev": "finished", "key": job.key, "result": result})

    # -- output --------------------------------------------------------------------------
    def _emit(self, event: dict[str, Any], *, log: bool = True) -> None:
        line = orjson.dumps(event) + b"\n"
        if log:
            self.log.write(line)
        if not self.orphaned:
            self.outbuf += line

    def _flush(self, *, final: bool = False) -> None:
        # Never block on the worker: a stopped worker must not stop the fencing.
        while self.outbuf and not self.orphaned:
            try:
                written = os.write(self.out_fd, self.outbuf)
            except BlockingIOError:
                return
            except (BrokenPipeError, OSError):
                self.outbuf.clear()
                self._orphan()
                return
            del self.outbuf[:written]
        if final:
            self.log.close()


def _start_mono(op: dict[str, Any]) -> float:
    """When a run may start, on CLOCK_MONOTONIC: as the worker said, or else its wall
    clock start time translated now."""
    at = op.get("start_at_mono")
    if at is not None:
        return float(at)
    return time.monotonic() + (int(op["start_at_ms"]) - now_ms()) / 1000


def _vector(raw: object) -> tuple[float, float, float]:
    values = [float(x) for x in raw][:3] if isinstance(raw, list) else []
    values += [0.0] * (3 - len(values))
    return values[0], values[1], values[2]


def read_log(
    path: Path,
    wanted: set[Key] | None = None,
    start: int = 0,
    into: dict[Key, dict[str, Any]] | None = None,
) -> tuple[dict[Key, dict[str, Any]], int]:
    """What an executor's log says of each attempt ({"starting", "started", "result"}),
    read from byte `start` on and merged `into` an earlier answer, for the `wanted`
    attempts only (all if None); and the offset to read from next time. A log grows with
    every run, so a worker that waits on a few attempts reads only what is new."""
    seen = {} if into is None else into
    try:
        with open(path, "rb") as f:
            f.seek(start)
            raw = f.read()
    except OSError:
        return seen, start
    end = raw.rfind(b"\n") + 1  # a torn last line is read again next time
    for line in raw[:end].splitlines():
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        key = (event["key"][0], int(event["key"][1]))
        if wanted is not None and key not in wanted:
            continue
        entry = seen.setdefault(key, {})
        if event["ev"] == "finished":
            entry["result"] = event["result"]
        else:
            entry[event["ev"]] = event
    return seen, start + end


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m connectors.worker.engine")
    parser.add_argument("--lease-file", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--cpu", type=float, default=float("inf"))
    parser.add_argument("--memory-mb", type=float, default=float("inf"))
    parser.add_argument("--gpu", type=float, default=float("inf"))
    parser.add_argument("--grace-s", type=float, default=1.0)
    parser.add_argument("--max-gap-s", type=float, default=2.5)
    parser.add_argument("--start-wait-s", type=float, default=30.0)
    parser.add_argument("--run-as-uid", type=int, default=None)
    parser.add_argument("--run-as-gid", type=int, default=None)
    parser.add_argument("--bwrap", default=None)
    parser.add_argument("--hide", action="append", default=[])
    parser.add_argument("--bwrap-shared-pids", action="store_true")
    parser.add_argument("--bwrap-tmpfs-bytes", type=int, default=DEFAULT_TMPFS_BYTES)
    parser.add_argument("--output-cap-mb", type=float, default=float(DEFAULT_OUTPUT_CAP_MB))
    args = parser.parse_args(argv)
    run_as = None if args.run_as_uid is None else (args.run_as_uid, args.run_as_gid)
    if os.getsid(0) != os.getpid():
        with contextlib.suppress(OSError):
            os.setsid()
    for warning in (become_subreaper(), conceal()):
        if warning:
            print(f"executor: warning: {warning}", file=sys.stderr)
    executor = ExecutorLoop(
        ExecutorConfig(
            args.lease_file,
            args.log,
            (args.cpu, args.memory_mb, args.gpu),
            args.grace_s,
            args.max_gap_s,
            args.start_wait_s,
            run_as,
            None
            if args.bwrap is None
            else Confinement(
                args.bwrap,
                tuple(args.hide),
                not args.bwrap_shared_pids,
                args.bwrap_tmpfs_bytes,
            ),
            int(args.output_cap_mb * MIB),
        )
    )
    executor.install_signals()
    executor.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
