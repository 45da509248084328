"""Process lifecycle: no cronlog process outlives its supervisor or hangs on its way out.

Helpers, used by the node (its ledger child), by `cronlog run` (its
components) and by every long-running command:

- `die_with_parent` / `die_with_parent_preexec`: Linux sends this process SIGKILL when
  its parent dies (PR_SET_PDEATHSIG), so even a SIGKILLed supervisor leaves no orphan.
  The signal fires when the *thread* that forked the child ends, so children must be
  started from a thread that lives as long as the parent (the main thread).
- `install_stop_watchdog`: once a stop signal has arrived, the process exits within a
  bound even when a client call ignores its timeout (librdkafka can hang in
  `send_offsets_to_transaction` or `close` when it loses its coordinator).
- `hold_instance_lock`: one `cronlog run` per state folder. An flock dies with the
  process that holds it, so a SIGKILLed supervisor leaves no stale lock.
- `run_steps`: the loop of every stepped loop (ledger, scheduler, dispatcher): open,
  step until stopped, close.
- `limit_malloc_arenas`, `trim_malloc_every`, `trim_malloc_once`: the process's memory
  (glibc's malloc keeps what a loop frees; see the notes above them).
- `space_out_full_collections`: the garbage collector's thresholds (see the note above).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import gc
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_ENV = "CRONLOG_STOP_TIMEOUT_S"
DEFAULT_STOP_TIMEOUT_S = 20.0
WATCHDOG_EXIT = 70  # EX_SOFTWARE: the process did not stop by itself

# Resolved once, in the parent: after a fork in a threaded parent the child must not
# take locks (dlopen's included) before it execs, so `die_with_parent_preexec` only calls.
_prctl: Callable[..., int] | None
try:
    _prctl = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: nothing to ask, the supervisor still stops
    _prctl = None


def _set_pdeathsig() -> None:
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no-op elsewhere).

    `parent_pid` is who started us; without it, the parent of a multiprocessing child,
    else whether we were re-parented to init. If the parent died before the request was
    made, nobody will send the signal: exit now.
    """
    if parent_pid is None:
        parent = multiprocessing.parent_process()
        parent_pid = parent.pid if parent is not None else None
    _set_pdeathsig()
    ppid = os.getppid()
    if ppid == 1 or (parent_pid is not None and ppid != parent_pid):
        os._exit(WATCHDOG_EXIT)


def die_with_parent_preexec() -> Callable[[], None]:
    """A `subprocess.Popen(preexec_fn=...)` that makes the child die with this process.

    It runs in the child between fork and exec; the request survives the exec."""
    parent_pid = os.getpid()

    def preexec() -> None:
        _set_pdeathsig()
        if os.getppid() != parent_pid:  # the parent died before the request was made
            os._exit(WATCHDOG_EXIT)

    return preexec


def stop_timeout_s(setting: str | None, default: float = DEFAULT_STOP_TIMEOUT_S) -> float:
    """The bound on a stop, from `setting` (CRONLOG_STOP_TIMEOUT_S's value, seconds, which
    the entry point reads and passes in) or `default`."""
    raw = (setting or "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError as exc:
        raise ValueError(f"{STOP_TIMEOUT_ENV} must be a number of seconds, got {raw!r}") from exc
    if value <= 0:
        raise ValueError(f"{STOP_TIMEOUT_ENV} must be positive, got {raw!r}")
    return value


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class _Watchdog:
    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self.armed = False
        self.lock = threading.Lock()

    def arm(self, signum: int) -> None:
        with self.lock:
            if self.armed:
                return
            self.armed = True
        name = signal.Signals(signum).name
        timer = threading.Timer(self.bound_s, self._fire, args=(name,))
        timer.daemon = True
        timer.start()
        # The timer thread needs the GIL; a C call that hangs holding it would starve
        # it. The kernel's alarm (SIGALRM, default action: terminate) does not.
        with contextlib.suppress(ValueError, OSError):
            if signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None):
                signal.setitimer(signal.ITIMER_REAL, self.bound_s + 5)

    def _fire(self, name: str) -> None:
        message = (
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} CRITICAL cronlog.lifecycle "
            f"pid {os.getpid()} did not stop within {self.bound_s:g} s of {name}: "
            "exiting hard (a call that ignored its timeout?)\n"
        )
        with contextlib.suppress(OSError):  # not logging: its lock may be held by the hang
            os.write(2, message.encode())
        os._exit(WATCHDOG_EXIT)

    def wrap(self, handler: _Handler) -> _Handler:
        """A handler that arms the watchdog, then does what `handler` did."""
        if not callable(handler) or getattr(handler, "_cronlog_watchdog", False):
            return handler  # SIG_DFL ends the process anyway; SIG_IGN means no stop

        def armed(signum: int, frame: FrameType | None) -> Any:
            self.arm(signum)
            return handler(signum, frame)

        # Our own marker on the wrapper just made (underscored so it cannot clash with
        # anything else on a handler): `wrap` never wraps an armed handler twice.
        armed._cronlog_watchdog = True  # type: ignore[attr-defined]  # noqa: SLF001
        armed.__wrapped__ = handler  # type: ignore[attr-defined]
        return armed


_installed: _Watchdog | None = None


def install_stop_watchdog(bound_s: float) -> float:
    """Exit hard `bound_s` after the first SIGTERM/SIGINT/SIGHUP that has a handler (the
    entry point's bound: `stop_timeout_s` of CRONLOG_STOP_TIMEOUT_S, connectors/cli/common.py).

    Whoever handles the signal: the handlers in place now and every handler installed
    later through `signal.signal` (asyncio's `add_signal_handler`, which uvicorn uses,
    installs one that way; so does the node) are wrapped so that they arm the
    watchdog first. Call it from the main thread before the command sets up its own
    handlers. Returns the bound. Idempotent.

    A Python handler runs only when the main thread gets back to the interpreter, so a
    signal that arrives while the main thread is already stuck in a C call does not arm
    it; a supervisor's SIGKILL (or systemd's) covers that case.
    """
    global _installed
    if _installed is not None:
        return _installed.bound_s
    watchdog = _Watchdog(bound_s)
    _installed = watchdog
    original = signal.signal

    def wrapping_signal(signalnum: int, handler: _Handler) -> _Handler:
        if signalnum in STOP_SIGNALS:
            handler = watchdog.wrap(handler)
        return original(signalnum, handler)

    signal.signal = wrapping_signal
    for signum in STOP_SIGNALS:
        current = signal.getsignal(signum)
        if callable(current):
            original(signum, watchdog.wrap(current))
    return watchdog.bound_s


class InstanceRunning(Exception):
    """Another process holds the lock; `pid` is its pid when it wrote it (else None)."""

    def __init__(self, path: Path, pid: int | None) -> None:
        super().__init__(f"{path} is held by pid {pid}")
        self.path = path
        self.pid = pid


def hold_instance_lock(path: Path) -> IO[str]:
    """Take an exclusive lock on `path` for the life of this process (keep the returned
    file open) and write our pid in it, or raise InstanceRunning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "a+")  # noqa: SIM115 - held open for the process's life
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        text = handle.read().strip()
        handle.close()
        raise InstanceRunning(path, int(text) if text.isdigit() else None) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def run_steps(
    open_: Callable[[], bool],
    step: Callable[[], None],
    close: Callable[[], None],
    stop: threading.Event,
) -> None:
    """`open_()`, then `step()` until `stop` is set, then `close()` (also on an error); a
    loop that could not open (stopped first) neither steps nor closes. Tests drive the
    three parts themselves."""
    if not open_():
        return
    try:
        while not stop.is_set():
            step()
    finally:
        close()


# -- the process's memory ---------------------------------------------------------------
# glibc gives every thread that allocates its own malloc arena (up to 8 per core), and an
# arena keeps what its thread freed; a loop that reads batches frees most of what it
# allocates, so two arenas hold less of it for the same work.
# Trimming is off unless CRONLOG_MALLOC_TRIM_S asks for it: malloc_trim walks every free
# chunk with the arena locked, and the threads that allocate wait, so periodic trimming
# buys a smaller registry's memory with late starts under load. The figures of both are
# in docs/performance.md's changelog (2026-12-03, fifth round).
MALLOC_ARENAS = 2
TRIM_ENV = "CRONLOG_MALLOC_TRIM_S"


def limit_malloc_arenas() -> None:
    """Cap glibc's malloc arenas for this process (mallopt M_ARENA_MAX, before its loops'
    threads start) and for its children (MALLOC_ARENA_MAX, read at their start). An
    operator's own MALLOC_ARENA_MAX wins. Best effort: glibc only, never fatal."""
    # Not configuration read here: glibc's own variable, set in the environment the
    # children inherit (glibc reads it at their start), kept if the operator set it.
    chosen = os.environ.setdefault("MALLOC_ARENA_MAX", str(MALLOC_ARENAS))
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-8, int(chosen))  # M_ARENA_MAX


# CPython's collector walks every tracked object in a full collection, holding the GIL:
# a worker holding a burst's 50,000 attempts tracks 300,000-500,000 objects, and each full
# collection took it 0.4-1.1 s, during which its executor thread started nothing: that
# second's runs all started late (docs/performance.md, "Bursts with default options").
# Full collections come after `threshold2` collections of the middle generation (and
# only once the objects promoted since the last one are a quarter of the old ones):
# 1,000 instead of 10 makes them a hundred times rarer. The young generations are
# collected as often as before, so cyclic garbage that dies young goes as soon as
# before; what reaches the old generation waits longer. A worker makes none once
# started (a full collection every 15 s through a burst found 0 objects), so it is set
# for workers; the node and its ledgers keep CPython's thresholds.
GC_THRESHOLDS = (700, 10, 1000)


def space_out_full_collections() -> None:
    """Set this process's collector thresholds to `GC_THRESHOLDS` (the note above)."""
    gc.set_threshold(*GC_THRESHOLDS)


_trim_lock = threading.Lock()
_trimmed_at = -float("inf")
TRIM_ONCE_MIN_GAP_S = 30.0


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None


def _rss_mb() -> float | None:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def trim_malloc_once(what: str, log: Callable[..., None] | None = None) -> None:
    """Hand the free memory of every malloc arena back to the OS once, now, on a daemon
    thread: after a catch-up, whose reading (consumer buffers, a backlog of raw records,
    the decoded batches) is freed at once but kept by the arenas, and after a takeover
    that is most of the node's memory (docs/performance.md, eighth round). Once is cheap
    and off the hot path (nothing runs yet); at most one per TRIM_ONCE_MIN_GAP_S, so a
    burst of assignments trims once. `log` (a logger's info) gets the RSS before and after
    and the trim's time."""
    global _trimmed_at
    with _trim_lock:
        now = time.monotonic()
        if now - _trimmed_at < TRIM_ONCE_MIN_GAP_S:
            return
        _trimmed_at = now
    trim = _malloc_trim()
    if trim is None:
        return

    def run() -> None:
        before, started = _rss_mb(), time.monotonic()
        trim(0)
        after, took_ms = _rss_mb(), (time.monotonic() - started) * 1000
        if log is not None and before is not None and after is not None:
            log(
                "%s: handed %.0f MB of freed memory back in %.0f ms (RSS %.0f -> %.0f MB)",
                what,
                before - after,
                took_ms,
                before,
                after,
            )

    threading.Thread(target=run, name="malloc-trim-once", daemon=True).start()


def malloc_trim_s(setting: str | None) -> float:
    """The trimming period from `setting` (CRONLOG_MALLOC_TRIM_S's value, which the entry
    point reads and passes in); unset, empty or not a number: 0, never."""
    try:
        return float(setting or 0)
    except ValueError:
        return 0.0


def trim_malloc_every(every_s: float) -> None:
    """Hand the free memory of every malloc arena back to the OS every `every_s` (0 or
    less: never; `malloc_trim_s` of CRONLOG_MALLOC_TRIM_S), with glibc's malloc_trim on a
    daemon thread. Safe beside allocating threads, which it locks out of one arena at a
    time: they wait meanwhile (above). A no-op where glibc is not."""
    if every_s <= 0:
        return
    trim = _malloc_trim()
    if trim is None:
        return

    def loop() -> None:
        while True:
            time.sleep(every_s)
            trim(0)

    threading.Thread(target=loop, name="malloc-trim", daemon=True).start()
