"""How a worker runs what it was granted: the `Executor` protocol and its two kinds.

- `ProcessExecutor` (the default): one long-lived executor process per worker incarnation
  (connectors/worker/engine.py) starts the jobs and guards them; this class is the
  worker's side of the pipe to it.
- `NoopExecutor`: runs nothing; an attempt "starts" at its time and succeeds at once. For
  benchmarks of the control plane, never for real work.

The worker's main loop only calls `start`, `cancel`, `events` and `health`; it does not
know which kind it drives.
"""

from __future__ import annotations

import contextlib
import heapq
import math
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import orjson

from connectors.worker.confine import Confinement
from connectors.worker.outputcap import DEFAULT_OUTPUT_CAP_MB
from streams.core.clock import BrokerClock

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class StartSpec:
    key: Key
    run_dir: Path
    argv: tuple[str, ...]
    env: dict[str, str]
    timeout_s: float
    memory_mb: int
    start_at_ms: int  # the run's start time, epoch ms
    need: tuple[float, float, float]
    # When to start it, on CLOCK_MONOTONIC: the worker's broker clock translates the
    # start time (broker time) into it. None: when this machine's wall clock reaches
    # start_at_ms.
    start_at_mono: float | None = None
    # When the worker claimed the attempt, on CLOCK_MONOTONIC: the executor starts
    # nothing claimed before a lapse of the lease (engine.py `Lease.voids`).
    claimed_mono: float | None = None

    def start_mono(self) -> float:
        if self.start_at_mono is not None:
            return self.start_at_mono
        return time.monotonic() + (self.start_at_ms - time.time() * 1000) / 1000


@dataclass(frozen=True, slots=True)
class Started:
    key: Key
    pid: int
    started_ms: int  # this machine's wall clock
    started_mono: float | None = None  # CLOCK_MONOTONIC


@dataclass(frozen=True, slots=True)
class Finished:
    key: Key
    outcome: str  # exited | timeout | cancelled | fenced | error | not_started
    exit_code: int | None
    signal: int | None
    started_ms: int | None  # this machine's wall clock
    finished_ms: int
    error: str
    started_mono: float | None = None  # CLOCK_MONOTONIC
    finished_mono: float | None = None
    # Why its output was cut ('' if it was not): connectors/worker/outputcap.py.
    output_cut: str = ""

    @staticmethod
    def of(key: Key, result: dict[str, object]) -> Finished:
        def opt(name: str) -> int | None:
            value = result.get(name)
            return int(value) if isinstance(value, int) else None

        def mono(name: str) -> float | None:
            value = result.get(name)
            return float(value) if isinstance(value, int | float) else None

        return Finished(
            key,
            str(result["outcome"]),
            opt("exit_code"),
            opt("signal"),
            opt("started_ms"),
            int(str(result["finished_ms"])),
            str(result.get("error") or ""),
            mono("started_mono"),
            mono("finished_mono"),
            str(result.get("output_cut") or ""),
        )


Event = Started | Finished


class Executor(Protocol):
    #: The file where the executor records what it started and how it ended ('' if none).
    log_path: str
    pid: int
    #: Whether runs leave stdout/stderr files in their run directory to stream.
    output: bool

    def start(self, spec: StartSpec) -> None: ...
    def cancel(self, key: Key) -> None: ...
    def events(self) -> list[Event]: ...
    def health(self) -> str:
        """'' while usable; otherwise why not (the worker then replaces it)."""
        ...

    def kill(self) -> None: ...
    def close(self) -> None: ...


class NoopExecutor:
    """Starts nothing: each attempt starts at its time and exits 0 at once.

    Its clock runs on a thread of its own, as the executor process runs apart from the
    worker's loop: a run starts when its instant comes, whatever the loop is doing (at
    a burst, reporting the first thousands of starts takes the loop seconds, which must
    not delay the starts behind them). The loop collects the events (`events`).

    Given the worker's broker clock, a run starts when that clock's newest bound reaches
    its start time (`start_at_ms`, broker time), not at the instant translated when it
    was handed over: the bound carried forward loses up to 1 ms a second
    (streams/core/clock.py), so a run handed over two minutes ahead, as a burst's are,
    would start 0.12 s late. Samples only move the instants earlier, never before the
    broker's time, so the thread looks again as a start nears."""

    log_path = ""
    pid = 0
    output = False
    RECHECK_S = 0.02
    RECHECK_MAX_S = 0.1

    def __init__(self, broker: BrokerClock | None = None) -> None:
        self.broker = broker
        # (order, attempt), a heap: the start time (broker ms) given a broker clock,
        # else the monotonic instant.
        self.due: list[tuple[float, Key]] = []
        self.waiting: set[Key] = set()
        self._out: list[Event] = []
        self._changed = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self, spec: StartSpec) -> None:
        order = spec.start_at_ms if self.broker is not None else spec.start_mono()
        with self._changed:
            if spec.key not in self.waiting:
                self.waiting.add(spec.key)
                heapq.heappush(self.due, (order, spec.key))
                self._changed.notify()
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._clock, name="noop executor", daemon=True
                )
                self._thread.start()

    def _instant(self, order: float) -> float:
        """The monotonic instant of a heap order (see `due`)."""
        if self.broker is None:
            return order
        at = self.broker.mono_at(int(order))
        return math.inf if at is None else at

    def cancel(self, key: Key) -> None:
        with self._changed:
            if key in self.waiting:
                self.waiting.discard(key)  # its heap entry is skipped when it comes up
                at = int(time.time() * 1000)
                self._out.append(Finished(key, "not_started", None, None, None, at, "cancelled"))

    def _clock(self) -> None:
        with self._changed:
            while not self._closed:
                now = time.monotonic()
                while self.due and self._instant(self.due[0][0]) <= now:
                    _, key = heapq.heappop(self.due)
                    if key in self.waiting:
                        self.waiting.discard(key)
                        at, mono = int(time.time() * 1000), time.monotonic()  # honest times
                        self._out += [
                            Started(key, 0, at, mono),
                            Finished(key, "exited", 0, None, at, at, "", mono, mono),
                        ]
                if not self.due:
                    self._changed.wait(None)
                    continue
                wait = max(0.0, self._instant(self.due[0][0]) - now)
                # With a broker clock, looked at again as the instant nears, and at least
                # every RECHECK_MAX_S: a sample moves it earlier by a millisecond a second
                # since the sample before (and the clock unsynced has no instant at all).
                recheck = self.RECHECK_S + min(wait / 2, self.RECHECK_MAX_S)
                self._changed.wait(wait if self.broker is None else min(wait, recheck))

    def events(self) -> list[Event]:
        with self._changed:
            out, self._out = self._out, []
        return out

    def heap_keys(self) -> list[Key]:
        """The attempts in the start heap, in heap order (a cancelled one stays there
        until its instant comes up), read under the executor's lock: what
        tests/processes/test_noop_executor.py waits on to see the clock thread's work."""
        with self._changed:
            return [key for _, key in self.due]

    def health(self) -> str:
        return ""

    def kill(self) -> None:
        self.close()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self.waiting.clear()
            self.due.clear()
            self._changed.notify()


# How often, at most, the executor process is told the broker clock moved.
CLOCK_EVERY_S = 0.2


class ProcessExecutor:
    """The worker's end of the executor process: JSON lines both ways, never blocking."""

    def __init__(
        self,
        lease_file: Path,
        log_file: Path,
        capacity: tuple[float, float, float],
        *,
        grace_s: float = 1.0,
        max_gap_s: float = 2.5,
        silence_s: float = 3.0,
        stderr: Path | None = None,
        run_as: tuple[int, int] | None = None,
        confinement: Confinement | None = None,
        broker: BrokerClock | None = None,
        output_cap_mb: float = DEFAULT_OUTPUT_CAP_MB,
    ) -> None:
        self.log_path = str(log_file)
        # The worker's broker clock, handed on to the executor process as it improves:
        # starts follow its newest bound (see `NoopExecutor`), not the instants
        # translated at the hand-over.
        self.broker = broker
        self.clock_sent: tuple[float, float] | None = None
        self.clock_sent_mono = 0.0
        self.output = True
        self.silence_s = silence_s
        argv = [
            sys.executable,
            "-m",
            "connectors.worker.engine",
            "--lease-file",
            str(lease_file),
            "--log",
            str(log_file),
            "--cpu",
            repr(capacity[0]),
            "--memory-mb",
            repr(capacity[1]),
            "--gpu",
            repr(capacity[2]),
            "--grace-s",
            repr(grace_s),
            "--max-gap-s",
            repr(max_gap_s),
            "--output-cap-mb",
            repr(output_cap_mb),
        ]
        if run_as is not None:
            argv += ["--run-as-uid", str(run_as[0]), "--run-as-gid", str(run_as[1])]
        if confinement is not None:
            argv += confinement.args()
        with open(stderr or os.devnull, "ab") as err:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                # Not configuration: the worker's environment handed on to its child.
                env={**os.environ, "PYTHONPATH": _pythonpath()},
            )
        self.pid = self.proc.pid
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.stdin_fd = self.proc.stdin.fileno()
        self.stdout_fd = self.proc.stdout.fileno()
        os.set_blocking(self.stdout_fd, False)
        os.set_blocking(self.stdin_fd, False)
        self.stuck_since: float | None = None  # when a write to it last could not proceed
        self.inbuf = b""
        self.outbuf = bytearray()
        self.heard = time.monotonic()
        self.closed = False

    def start(self, spec: StartSpec) -> None:
        self._send(
            {
                "op": "start",
                "key": spec.key,
                "run_dir": str(spec.run_dir),
                "argv": spec.argv,
                "env": spec.env,
                "timeout_s": spec.timeout_s,
                "memory_mb": spec.memory_mb,
                "start_at_ms": spec.start_at_ms,
                "start_at_mono": spec.start_at_mono,
                "claimed_mono": spec.claimed_mono,
                "need": spec.need,
                **self._clock(),
            }
        )

    def _clock(self) -> dict[str, object]:
        """The broker clock's bound, for an op: with a start (its time is broker time),
        and alone (`events`) when it moved a millisecond or more."""
        bound = None if self.broker is None else self.broker.bound()
        if bound is None:
            return {}
        self.clock_sent, self.clock_sent_mono = bound, time.monotonic()
        return {"clock": bound}

    def _send_clock(self) -> None:
        if self.broker is None or time.monotonic() - self.clock_sent_mono < CLOCK_EVERY_S:
            return
        bound = self.broker.bound()
        if bound is not None and (self.clock_sent is None or bound[0] - self.clock_sent[0] >= 1):
            self._send({"op": "clock", **self._clock()})

    def cancel(self, key: Key) -> None:
        self._send({"op": "cancel", "key": key})

    def _send(self, op: dict[str, object]) -> None:
        self.outbuf += orjson.dumps(op) + b"\n"
        self._flush()

    def _flush(self) -> None:
        # Never block the worker's loop on the executor: a stopped or wedged executor
        # fills the pipe, and `health` then reports it, so it gets replaced.
        while self.outbuf and not self.closed:
            try:
                written = os.write(self.stdin_fd, self.outbuf)
            except BlockingIOError:
                if self.stuck_since is None:
                    self.stuck_since = time.monotonic()
                return
            except OSError:
                self.outbuf.clear()
                return
            del self.outbuf[:written]
        self.stuck_since = None

    def events(self) -> list[Event]:
        self._send_clock()
        self._flush()
        out: list[Event] = []
        while True:
            try:
                data = os.read(self.stdout_fd, 1 << 20)
            except BlockingIOError:
                break
            except OSError:
                break
            if not data:
                break
            self.heard = time.monotonic()
            self.inbuf += data
        if b"\n" not in self.inbuf:
            return out
        lines = self.inbuf.split(b"\n")
        self.inbuf = lines.pop()
        for line in lines:
            if not line:
                continue
            event = orjson.loads(line)
            if event["ev"] == "tick":
                continue
            key = (event["key"][0], int(event["key"][1]))
            if event["ev"] == "started":
                mono = event.get("started_mono")
                out.append(
                    Started(
                        key,
                        int(event["pid"]),
                        int(event["started_ms"]),
                        None if mono is None else float(mono),
                    )
                )
            elif event["ev"] == "finished":
                out.append(Finished.of(key, event["result"]))
        return out

    def health(self) -> str:
        code = self.proc.poll()
        if code is not None:
            return f"the executor process exited (status {code})"
        silent = time.monotonic() - self.heard
        if silent > self.silence_s:
            return f"the executor process has been silent for {silent:.1f} s"
        if self.stuck_since is not None and time.monotonic() - self.stuck_since > self.silence_s:
            return "the executor process has not read its input for too long"
        return ""

    def kill(self) -> None:
        """SIGKILL the executor (the caller kills the job groups it knew of)."""
        self.closed = True
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)  # one in uninterruptible sleep is left to the kernel

    def close(self) -> None:
        """Let it go: it starts nothing more and fences its jobs when the lease ends."""
        self.closed = True
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def _pythonpath() -> str:
    """The executor imports this package: pass on where it was imported from (the folder
    holding ``connectors/``: site-packages for a wheel, the checkout for an editable
    install or a bench's copy of the sources), not the repository."""
    root = str(Path(__file__).resolve().parents[2])
    # Not configuration: the interpreter's own search path, extended for the child.
    existing = os.environ.get("PYTHONPATH", "")
    return f"{root}{os.pathsep}{existing}" if existing else root
