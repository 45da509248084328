"""A worker's environment out of reach of a job running as the worker's own user
(connectors/worker/procs.py, `conceal`): two processes of one unprivileged user, the
second reading the first's /proc/PID/environ, as a job would read its worker's."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# An interpreter the unprivileged user may run (the test's own may live under /root).
PYTHON = shutil.which("python3", path="/usr/bin:/bin")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or PYTHON is None, reason="needs root to act as another user"
)

HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from connectors.worker.procs import conceal
if sys.argv[2] == "conceal":
    assert conceal() == ""
print("ready", flush=True)
time.sleep(60)
"""


def _read_environ_as_the_same_user(hide: bool) -> subprocess.CompletedProcess[str]:
    marker = f"CRONLOG_SECRET_PROBE=secret-{uuid.uuid4().hex}"
    holder = subprocess.Popen(
        [str(PYTHON), "-c", HOLDER, str(ROOT), "conceal" if hide else "plain"],
        env={"PATH": "/usr/bin:/bin", marker.split("=")[0]: marker.split("=")[1]},
        user="nobody",
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        return subprocess.run(
            ["cat", f"/proc/{holder.pid}/environ"],
            user="nobody",
            capture_output=True,
            text=True,
            timeout=10,
        )
    finally:
        holder.kill()
        holder.wait()


def test_a_process_of_the_same_user_reads_a_plain_environment() -> None:
    # The control: without conceal, the attack works.
    read = _read_environ_as_the_same_user(hide=False)
    assert read.returncode == 0
    assert "CRONLOG_SECRET_PROBE=secret-" in read.stdout


def test_a_concealed_environment_is_not_readable_by_the_same_user() -> None:
    read = _read_environ_as_the_same_user(hide=True)
    assert read.returncode != 0
    assert "Permission denied" in read.stderr
    assert "secret-" not in read.stdout
