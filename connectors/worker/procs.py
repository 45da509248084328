"""Process helpers shared by the worker and its executor (Linux)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
from collections.abc import Callable

_PR_SET_CHILD_SUBREAPER = 36


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def become_subreaper() -> str:
    """Adopt orphaned descendants (Linux), so they are reaped here, not left as zombies
    where init does not reap; '' or why that was not possible."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl(PR_SET_CHILD_SUBREAPER) unavailable: {exc}"
    return ""


def limit_address_space(limit_bytes: int, report_fd: int) -> Callable[[], None]:
    """A ``preexec_fn`` that sets ``RLIMIT_AS`` (soft and hard, never above an existing
    hard limit) and writes b'ok' or the error to ``report_fd``."""

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


def decode_status(status: int) -> tuple[int | None, int | None]:
    """(exit code, signal) from a wait status."""
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None
