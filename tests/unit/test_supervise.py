"""The per-run supervisor (connectors/supervise.py), with real local processes.

Every test runs the supervisor as the worker does (``python -m connectors.supervise``,
spawned with ``start_new_session=True``) on short jobs (sleep, sh -c, python -c) with
short timeouts and grace periods; no Kafka.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from connectors.supervise import (
    RESULT_FILE,
    STARTED_FILE,
    now_ms,
    read_lease,
    read_result,
    read_started,
    supervise_command,
    write_lease,
)

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
GRACE_S = 0.5

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


# --------------------------------------------------------------------------------------
# Helpers


def wait_until(check: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.02)


def proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of a process, or None if there is none."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    state, ppid, pgrp = raw[raw.rindex(b")") + 2 :].split()[:3]
    return state.decode(), int(ppid), int(pgrp)


def running(pid: int) -> bool:
    stat = proc_stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def group_members(pgid: int) -> list[int]:
    """Every process of the group, zombies included."""
    members = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat is not None and stat[2] == pgid:
                members.append(int(name))
    return members


def catches_sigterm(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    return False


class Run:
    """One supervised run in a fresh directory under tmp_path."""

    def __init__(self, tmp_path: Path, name: str = "run") -> None:
        self.dir = tmp_path / name
        self.lease = tmp_path / f"{name}.lease"

    def command(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float = 10.0,
        grace_s: float = GRACE_S,
        memory_mb: int | None = None,
        start_at_ms: int | None = None,
    ) -> list[str]:
        return supervise_command(
            self.dir,
            self.lease,
            timeout_s,
            argv,
            grace_s=grace_s,
            memory_mb=memory_mb,
            start_at_ms=start_at_ms,
        )

    def start(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float = 10.0,
        start_at_ms: int | None = None,
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            self.command(argv, timeout_s=timeout_s, start_at_ms=start_at_ms),
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        stdin: bytes | None = None,
        timeout_s: float = 10.0,
        memory_mb: int | None = None,
        start_at_ms: int | None = None,
    ) -> tuple[int, dict[str, object]]:
        """Run to the end; (supervisor exit code, result.json)."""
        command = self.command(
            argv, timeout_s=timeout_s, memory_mb=memory_mb, start_at_ms=start_at_ms
        )
        done = subprocess.run(
            command,
            cwd=REPO,
            env=env,
            input=stdin if stdin is not None else b"",
            start_new_session=True,
            timeout=30,
            check=False,
        )
        return done.returncode, self.result()

    def result(self) -> dict[str, object]:
        result = read_result(self.dir)
        assert result is not None, "no result.json"
        return result

    def started(self) -> dict[str, object]:
        started = read_started(self.dir)
        assert started is not None, "no started.json"
        return started

    def pgid(self) -> int:
        pgid = self.started()["pgid"]
        assert isinstance(pgid, int)
        return pgid

    def text(self, name: str) -> str:
        return (self.dir / name).read_text()


@pytest.fixture
def run(tmp_path: Path) -> Run:
    """A run whose lease is renewed far into the future (no fencing unless a test says)."""
    supervised = Run(tmp_path)
    write_lease(supervised.lease, now_ms() + 600_000)
    return supervised


def py(code: str) -> list[str]:
    return [PY, "-c", code]


TRAP_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "open('trapped', 'w').close(); time.sleep(100)"
)


# --------------------------------------------------------------------------------------
# Normal exits, output, environment


def test_exit_code_zero(run: Run) -> None:
    code, result = run.run(["true"])
    assert code == 0
    assert result["outcome"] == "exited"
    assert result["exit_code"] == 0
    assert result["signal"] is None
    assert result["error"] == ""
    assert result["rlimit_applied"] is False
    started = run.started()
    assert started["pid"] == started["pgid"]
    assert result["started_ms"] == started["started_ms"]
    assert isinstance(result["finished_ms"], int)
    assert isinstance(result["started_ms"], int)
    assert result["finished_ms"] >= result["started_ms"]
    assert isinstance(result["duration_ms"], int)
    assert 0 <= result["duration_ms"] < 5_000
    assert set(result) == {
        "outcome",
        "exit_code",
        "signal",
        "started_ms",
        "finished_ms",
        "duration_ms",
        "error",
        "rlimit_applied",
        "rlimit_error",
    }


def test_exit_code_three_is_recorded_and_supervisor_exits_1(run: Run) -> None:
    code, result = run.run(["sh", "-c", "exit 3"])
    assert code == 1
    assert result["outcome"] == "exited"
    assert result["exit_code"] == 3
    assert result["signal"] is None


def test_job_killed_by_a_signal_of_its_own(run: Run) -> None:
    code, result = run.run(["sh", "-c", "kill -KILL $$"])
    assert code == 1
    assert result["outcome"] == "exited"
    assert result["exit_code"] is None
    assert result["signal"] == signal.SIGKILL


def test_stdout_and_stderr_are_appended_to_files_in_the_run_dir(run: Run) -> None:
    run.dir.mkdir()
    (run.dir / "stdout").write_text("earlier\n")
    code, _ = run.run(["sh", "-c", "echo out; echo err >&2; pwd"])
    assert code == 0
    assert run.text("stdout") == f"earlier\nout\n{run.dir}\n"  # cwd is the run dir
    assert run.text("stderr") == "err\n"


def test_job_does_not_get_the_supervisors_stdin(run: Run) -> None:
    code, _ = run.run(py("import sys; print(repr(sys.stdin.read()))"), stdin=b"secret\n")
    assert code == 0
    assert run.text("stdout") == "''\n"


def test_environment_passes_through(run: Run) -> None:
    env = {**os.environ, "CRONLOG_RUN_ID": "run-42", "JOB_SETTING": "a b"}
    code, _ = run.run(["sh", "-c", 'printf "%s|%s" "$CRONLOG_RUN_ID" "$JOB_SETTING"'], env=env)
    assert code == 0
    assert run.text("stdout") == "run-42|a b"


def test_missing_executable_is_an_error_and_starts_nothing(run: Run) -> None:
    code, result = run.run(["no-such-program-for-cronlog"])
    assert code == 1
    assert result["outcome"] == "error"
    assert "no-such-program-for-cronlog" in str(result["error"])
    assert result["started_ms"] is None
    assert result["duration_ms"] is None
    assert result["exit_code"] is None
    assert not (run.dir / STARTED_FILE).exists()


def test_invalid_options_are_reported_as_an_error(run: Run) -> None:
    code, result = run.run(["true"], timeout_s=0)
    assert code == 1
    assert result["outcome"] == "error"
    assert "--timeout-s" in str(result["error"])
    assert not (run.dir / STARTED_FILE).exists()


# --------------------------------------------------------------------------------------
# Timeout and the process group


def test_timeout_kills_a_job_that_ignores_sigterm_after_the_grace(run: Run) -> None:
    code, result = run.run(py(TRAP_SIGTERM), timeout_s=1.0)
    assert code == 1
    assert (run.dir / "trapped").exists()
    assert result["outcome"] == "timeout"
    assert result["signal"] == signal.SIGKILL
    assert result["exit_code"] is None
    duration = result["duration_ms"]
    assert isinstance(duration, int)
    assert 1_000 + GRACE_S * 1_000 - 50 <= duration < 4_000
    assert group_members(run.pgid()) == []


def test_timeout_kills_background_children_in_the_group(run: Run) -> None:
    code, result = run.run(["sh", "-c", "sleep 100 & echo $! > bg.pid; sleep 100"], timeout_s=1.0)
    assert code == 1
    assert result["outcome"] == "timeout"
    assert result["signal"] == signal.SIGTERM  # sh and sleep die on SIGTERM: no SIGKILL
    duration = result["duration_ms"]
    assert isinstance(duration, int)
    assert 950 <= duration < 3_000
    assert not running(int(run.text("bg.pid")))
    assert group_members(run.pgid()) == []


def test_processes_left_behind_by_a_normal_exit_are_killed(run: Run) -> None:
    code, result = run.run(["sh", "-c", "sleep 100 & echo $! > bg.pid; exit 0"])
    assert code == 0
    assert result["outcome"] == "exited"
    assert result["exit_code"] == 0
    assert not running(int(run.text("bg.pid")))
    assert group_members(run.pgid()) == []


def test_descendants_that_left_the_group_are_killed_too(run: Run) -> None:
    escape = (
        "import subprocess; "
        "p = subprocess.Popen(['sleep', '100'], start_new_session=True); "
        "open('escaped.pid', 'w').write(str(p.pid))"
    )
    code, result = run.run(py(escape))
    assert code == 0
    assert result["outcome"] == "exited"
    escaped = int(run.text("escaped.pid"))
    assert proc_stat(escaped) is None  # killed and reaped by the supervisor


# --------------------------------------------------------------------------------------
# Lease (self-fencing)


def test_lease_expiry_fences_the_job(run: Run) -> None:
    write_lease(run.lease, now_ms() + 1_000)
    code, result = run.run(["sh", "-c", "sleep 100 & sleep 100"], timeout_s=30.0)
    assert code == 1
    assert result["outcome"] == "fenced"
    assert "lease" in str(result["error"])
    duration = result["duration_ms"]
    assert isinstance(duration, int)
    assert 500 <= duration < 2_500
    assert group_members(run.pgid()) == []


def test_renewing_the_lease_keeps_the_job_running(run: Run) -> None:
    write_lease(run.lease, now_ms() + 500)
    supervisor = run.start(["sleep", "1.5"], timeout_s=30.0)
    try:
        while supervisor.poll() is None:
            write_lease(run.lease, now_ms() + 500)
            time.sleep(0.1)
    finally:
        supervisor.kill()
        supervisor.wait()
    assert supervisor.returncode == 0
    result = run.result()
    assert result["outcome"] == "exited"
    assert result["exit_code"] == 0


def test_missing_lease_is_tolerated_only_at_start_up(tmp_path: Path) -> None:
    run = Run(tmp_path)  # no lease file at all
    code, result = run.run(["sleep", "100"], timeout_s=30.0)
    assert code == 1
    assert result["outcome"] == "fenced"
    assert result["started_ms"] is not None  # started within the tolerance
    duration = result["duration_ms"]
    assert isinstance(duration, int)
    assert 1_500 <= duration < 3_500


def test_a_paused_worker_is_fenced_even_without_start_new_session(run: Run) -> None:
    """The worker spawns the supervisor in its own group and is then SIGSTOPped as a
    group: the supervisor must have left that group (setsid) and still fence the job."""
    write_lease(run.lease, now_ms() + 1_000)
    worker_code = "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"
    worker = subprocess.Popen(
        [PY, "-c", worker_code, *run.command(["sleep", "100"], timeout_s=30.0)],
        cwd=REPO,
        start_new_session=True,
    )
    try:
        wait_until(lambda: (run.dir / STARTED_FILE).exists(), what="the job to start")
        os.killpg(worker.pid, signal.SIGSTOP)
        wait_until(lambda: (run.dir / RESULT_FILE).exists(), timeout_s=5.0, what="a result")
        assert run.result()["outcome"] == "fenced"
        assert group_members(run.pgid()) == []
    finally:
        os.killpg(worker.pid, signal.SIGCONT)
        worker.wait(timeout=10)
    assert worker.returncode == 1


# --------------------------------------------------------------------------------------
# Cancel


def test_sigterm_to_the_supervisor_cancels_the_job(run: Run) -> None:
    supervisor = run.start(["sh", "-c", "sleep 100 & sleep 100"], timeout_s=30.0)
    try:
        wait_until(lambda: (run.dir / STARTED_FILE).exists(), what="the job to start")
        pgid = run.pgid()
        assert len(group_members(pgid)) >= 1
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=10) == 1
    finally:
        supervisor.kill()
        supervisor.wait()
    result = run.result()
    assert result["outcome"] == "cancelled"
    assert "SIGTERM" in str(result["error"])
    assert group_members(pgid) == []


def test_sigint_cancels_a_job_that_ignores_sigterm(run: Run) -> None:
    supervisor = run.start(py(TRAP_SIGTERM), timeout_s=30.0)
    try:
        wait_until(lambda: (run.dir / "trapped").exists(), what="the job to trap SIGTERM")
        supervisor.send_signal(signal.SIGINT)
        assert supervisor.wait(timeout=10) == 1
    finally:
        supervisor.kill()
        supervisor.wait()
    result = run.result()
    assert result["outcome"] == "cancelled"
    assert result["signal"] == signal.SIGKILL
    assert group_members(run.pgid()) == []


# --------------------------------------------------------------------------------------
# Delayed start


def test_start_at_delays_the_start(run: Run) -> None:
    start_at = now_ms() + 800
    code, result = run.run(["true"], start_at_ms=start_at)
    assert code == 0
    started_ms = result["started_ms"]
    assert isinstance(started_ms, int)
    assert start_at <= started_ms < start_at + 1_000
    assert run.started()["started_ms"] == started_ms


def test_start_at_in_the_past_starts_at_once(run: Run) -> None:
    before = now_ms()
    code, result = run.run(["true"], start_at_ms=before - 60_000)
    assert code == 0
    started_ms = result["started_ms"]
    assert isinstance(started_ms, int)
    assert before <= started_ms < before + 2_000


def test_cancel_before_the_start_never_starts_the_job(run: Run) -> None:
    supervisor = run.start(["touch", "ran"], start_at_ms=now_ms() + 10_000)
    try:
        wait_until(lambda: catches_sigterm(supervisor.pid), what="signal handlers")
        supervisor.send_signal(signal.SIGTERM)
        assert supervisor.wait(timeout=5) == 1
    finally:
        supervisor.kill()
        supervisor.wait()
    result = run.result()
    assert result["outcome"] == "cancelled"
    assert result["started_ms"] is None
    assert result["duration_ms"] is None
    assert not (run.dir / STARTED_FILE).exists()
    assert not (run.dir / "ran").exists()


def test_lease_expiry_before_the_start_never_starts_the_job(run: Run) -> None:
    write_lease(run.lease, now_ms() + 300)
    begin = time.monotonic()
    code, result = run.run(["touch", "ran"], start_at_ms=now_ms() + 5_000)
    assert time.monotonic() - begin < 3.0
    assert code == 1
    assert result["outcome"] == "fenced"
    assert result["started_ms"] is None
    assert not (run.dir / STARTED_FILE).exists()
    assert not (run.dir / "ran").exists()


# --------------------------------------------------------------------------------------
# Memory limit


def test_memory_limit_makes_a_large_allocation_fail(run: Run) -> None:
    code, result = run.run(py("b = bytearray(256 * 1024 * 1024)"), memory_mb=64)
    assert code == 1
    assert result["rlimit_applied"] is True
    assert result["rlimit_error"] == ""
    assert result["outcome"] == "exited"
    assert result["exit_code"] != 0
    assert "MemoryError" in run.text("stderr")


def test_memory_limit_leaves_room_for_a_small_job(run: Run) -> None:
    code, result = run.run(py("b = bytearray(8 * 1024 * 1024); print(len(b))"), memory_mb=64)
    assert code == 0
    assert result["rlimit_applied"] is True
    assert run.text("stdout") == f"{8 * 1024 * 1024}\n"


# --------------------------------------------------------------------------------------
# Helpers for the worker (in process)


def test_write_and_read_lease(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    assert read_lease(lease) is None
    write_lease(lease, 1_700_000_000_123)
    assert read_lease(lease) == 1_700_000_000_123
    write_lease(lease, 1_700_000_000_456)
    assert read_lease(lease) == 1_700_000_000_456
    assert [p.name for p in tmp_path.iterdir()] == ["lease"]  # no temporary files left
    lease.write_text("not a number")
    assert read_lease(lease) is None


def test_read_result_and_started_when_absent_or_garbled(tmp_path: Path) -> None:
    assert read_result(tmp_path) is None
    assert read_started(tmp_path) is None
    (tmp_path / RESULT_FILE).write_text("{")
    assert read_result(tmp_path) is None
    (tmp_path / RESULT_FILE).write_text("[1]")
    assert read_result(tmp_path) is None


def test_supervise_command_shape(tmp_path: Path) -> None:
    command = supervise_command(
        tmp_path / "r", tmp_path / "l", 2, ["echo", "--", "x"], memory_mb=10, start_at_ms=5
    )
    assert command[:3] == [sys.executable, "-m", "connectors.supervise"]
    split = command.index("--")
    assert command[split + 1 :] == ["echo", "--", "x"]
    options = command[3:split]
    assert options[options.index("--timeout-s") + 1] == "2.0"
    assert options[options.index("--memory-mb") + 1] == "10"
    assert options[options.index("--start-at-ms") + 1] == "5"
