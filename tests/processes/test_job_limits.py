"""The job boundary in the executor, on real processes (issue 53, items 4 and 10): the
output cap (RLIMIT_FSIZE, connectors/worker/outputcap.py) bounds a job's output files on
the worker's disk and the run says why it was cut; a sandboxed job (bubblewrap,
connectors/worker/confine.py, here as the `--run-as` user) has a PID namespace of its
own, whose end takes every process of the job with it, daemons included.

Before issue 53 a job's output grew without bound (only its first 1 MiB was shipped),
and a job process that left its group (setsid) outlived the job's timeout."""

from __future__ import annotations

import os
import pwd
import resource
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from connectors.worker.confine import Confinement, confinement
from connectors.worker.outputcap import MIB, can_raise_limits
from connectors.worker.procs import job_processes, spawn
from tests.processes.test_executor import Harness, group_gone
from tests.support.waiting import until_passes

NOBODY = pwd.getpwnam("nobody")
AS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="changing the jobs' user needs root")
# Writes 5 MiB to stdout, then says it finished (to stderr, which stays small).
FLOOD = ["sh", "-c", "head -c 5242880 /dev/zero; echo wrote-all >&2"]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def factory(**options: object) -> Harness:
        harness = Harness(
            tmp_path,
            (100.0, 1e9, 10.0),
            2.5,
            options.get("run_as"),  # type: ignore[arg-type]
            None,
            options.get("confinement"),  # type: ignore[arg-type]
            float(options.get("output_cap_mb", 64)),  # type: ignore[arg-type]
        )
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        if harness.executor.proc.poll() is None:
            harness.executor.kill()


def _traversable(h: Harness) -> None:
    for folder in (h.root, h.root.parent, h.root.parent.parent):
        folder.chmod(0o711)  # as a worker's state folder is, for the job's user


def test_output_past_the_cap_is_cut_and_the_run_says_so(make: Callable[..., Harness]) -> None:
    """With and without a memory limit (the executor's two ways of starting a job): the
    file stops at the cap exactly, the writer is stopped by SIGXFSZ, and the run's
    result says the output was cut. A run below the cap is not touched."""
    h = make(output_cap_mb=1)
    h.renew()
    spawned = h.finished(h.start("spawned", FLOOD))
    forked = h.finished(h.start("forked", FLOOD, memory_mb=512))
    small = h.finished(h.start("small", ["sh", "-c", "head -c 1000 /dev/zero"]))
    for key, result in (("spawned", spawned), ("forked", forked)):
        stdout = h.root / key / "stdout"
        assert stdout.stat().st_size == MIB, key
        # The writer was stopped by SIGXFSZ (the shell says so, and goes on).
        assert "File size limit exceeded" in (h.root / key / "stderr").read_text()
        assert result.output_cut.startswith("output cut: stdout passed the worker's output cap")
        assert "1 MiB" in result.output_cut
    assert small.output_cut == ""
    assert (small.outcome, small.exit_code) == ("exited", 0)


def test_a_job_cannot_raise_its_cap(make: Callable[..., Harness]) -> None:
    """The cap is the hard limit too: `ulimit -f unlimited` fails, and the output stays
    at the cap (a soft limit alone the job would simply raise)."""
    h = make(output_cap_mb=1)
    h.renew()
    raise_it = ["sh", "-c", "ulimit -f unlimited || echo refused >&2; head -c 3145728 /dev/zero"]
    result = h.finished(h.start("raiser", raise_it))
    assert "refused" in (h.root / "raiser" / "stderr").read_text()
    assert (h.root / "raiser" / "stdout").stat().st_size == MIB
    assert result.output_cut


@pytest.mark.skipif(not can_raise_limits(), reason="needs CAP_SYS_RESOURCE")
def test_posix_spawn_lends_the_cap_for_the_spawn_only(tmp_path: Path) -> None:
    """An executor that may raise its limit back starts jobs by posix_spawn: the job
    inherits the cap, the executor keeps its own limit."""
    before = resource.getrlimit(resource.RLIMIT_FSIZE)
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        pid = spawn(["sh", "-c", "ulimit -f"], {"PATH": "/usr/bin:/bin"}, tmp_path, out, out, MIB)
    finally:
        os.close(out)
    os.waitpid(pid, 0)
    assert (tmp_path / "out").read_text().strip() == str(MIB // 512)
    assert resource.getrlimit(resource.RLIMIT_FSIZE) == before


def test_no_cap_when_it_is_zero(make: Callable[..., Harness]) -> None:
    h = make(output_cap_mb=0)
    h.renew()
    result = h.finished(h.start("uncapped", FLOOD))
    assert (h.root / "uncapped" / "stdout").stat().st_size == 5 * MIB
    assert (result.exit_code, result.output_cut) == (0, "")


def _sandbox() -> Confinement:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    made = confinement([], run_as=(NOBODY.pw_uid, NOBODY.pw_gid))
    if isinstance(made, str):
        pytest.skip(made)
    return made


@AS_ROOT
def test_a_sandboxed_jobs_daemons_end_with_it(make: Callable[..., Harness]) -> None:
    """A job that leaves its process group (setsid) is still killed at its timeout: the
    kernel ends a PID namespace with its init, which is in the job's group."""
    made = _sandbox()
    h = make(run_as=(NOBODY.pw_uid, NOBODY.pw_gid), confinement=made)
    _traversable(h)
    h.renew()
    key = h.start("daemon", ["sh", "-c", "setsid sleep 300 & sleep 300"], timeout_s=1, memory_mb=0)
    result = h.finished(key)
    assert result.outcome == "timeout"

    def all_gone() -> None:
        assert job_processes("daemon", 1) == []

    until_passes(all_gone, 10, interval_s=0.1)
    started = h.started(key)
    assert started is not None
    assert group_gone(started.pid)


@AS_ROOT
def test_a_sandboxed_job_is_capped_and_keeps_its_grace(make: Callable[..., Harness]) -> None:
    """Under bubblewrap the cap holds (set on bwrap, inherited by the job), and a job
    being cancelled still gets SIGTERM and its grace before SIGKILL."""
    made = _sandbox()
    h = make(run_as=(NOBODY.pw_uid, NOBODY.pw_gid), confinement=made, output_cap_mb=1)
    _traversable(h)
    h.renew()
    flood = h.finished(h.start("flood", FLOOD))
    assert (h.root / "flood" / "stdout").stat().st_size == MIB
    assert flood.output_cut
    graceful = ["sh", "-c", "trap 'echo got-term; exit 7' TERM; echo ready; sleep 300 & wait"]
    key = h.start("graceful", graceful)
    stdout = h.root / "graceful" / "stdout"
    h.wait(lambda: stdout.exists() and "ready" in stdout.read_text(), what="the job's start")
    h.executor.cancel(key)
    assert h.finished(key).outcome == "cancelled"
    assert stdout.read_text().split() == ["ready", "got-term"]


def test_a_capped_job_is_started_as_it_was_before(make: Callable[..., Harness]) -> None:
    """However the cap is set (lent for the spawn, `prlimit` in the job's place, fork),
    the job sees its own argv[0] and its limit, and a missing program is an error of
    the start, as without a cap."""
    h = make(output_cap_mb=1)
    h.renew()
    seen = h.finished(h.start("seen", ["sh", "-c", 'echo "$0"; ulimit -f', "named"]))
    assert (seen.outcome, seen.exit_code) == ("exited", 0)
    assert (h.root / "seen" / "stdout").read_text().split() == ["named", str(MIB // 512)]
    for name, program in (("missing", "no-such-program-here"), ("absent", "/no/such/program")):
        bad = h.finished(h.start(name, [program]))
        assert bad.outcome == "error"
        assert program in bad.error
