"""The worker's lease: a small file that says until when the worker is known alive.

The heartbeat thread renews it only after Kafka acknowledged a heartbeat; the executor
(connectors/worker/engine.py), a process of its own, kills every job of the worker once
the deadline has passed. So a worker that is paused, wedged or cut off stops its jobs
before the failure detector declares it dead, without relying on its own main loop.
Each executor incarnation guards its own lease file, so a restarted worker never keeps an
earlier incarnation's jobs alive by accident.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
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


def write_lease(path: Path, deadline_ms: int) -> None:
    """Renew a lease: alive until ``deadline_ms`` (epoch ms). A deadline in the past
    fences every job guarded by it."""
    write_atomic(path, f"{int(deadline_ms)}\n".encode())


def read_lease(path: Path) -> int | None:
    """The lease deadline in epoch ms, or None if the file is missing or unparsable."""
    try:
        return int(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None
