"""Small process helpers shared by the Kafka and PostgreSQL parts of the local stack."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

Log = Callable[[str], None]


class StackError(RuntimeError):
    """The local stack cannot be brought to the asked state; the message says why."""


def port_open(port: int, host: str = "127.0.0.1", timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user (postgres)
    # A zombie child still answers kill(0); treat it as dead.
    try:
        status = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0]
    except (OSError, IndexError):
        return True
    return status != "Z"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def wait_until(
    check: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.25
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval_s)
    raise StackError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def stop_pid(pid: int, grace_s: float) -> bool:
    """SIGTERM, wait up to grace_s, then SIGKILL. Returns True if it had to kill."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return False
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def run(
    argv: Sequence[str],
    what: str,
    user: str | None = None,
    timeout_s: float = 600,
    env: dict[str, str] | None = None,
) -> str:
    """Run a command to completion; raise StackError with its output when it fails."""
    full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
    try:
        done = subprocess.run(
            full, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except FileNotFoundError as exc:
        raise StackError(f"{what}: {exc.filename} not found") from exc
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what}: no answer after {timeout_s:.0f} s") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-3000:]
        raise StackError(f"{what} failed (exit {done.returncode}):\n{output}")
    return done.stdout
