"""The executor process on real processes (no Kafka): start times, exit codes and output,
timeouts and cancel killing whole process groups, self-fencing when the lease expires,
when the worker goes away and when the executor itself was paused, memory limits,
start-time room and giving back runs that never started."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from connectors.stack.process import pid_alive
from connectors.worker.confine import Confinement
from connectors.worker.engine import Lease, lease_text, read_lease_file, read_log
from connectors.worker.executor import Event, Finished, ProcessExecutor, Started, StartSpec
from connectors.worker.lease import write_atomic, write_lease
from streams.core.clock import BrokerClock
from tests.support.waiting import until_passes


def now_ms() -> int:
    return int(time.time() * 1000)


class Harness:
    def __init__(
        self,
        root: Path,
        capacity: tuple[float, float, float],
        max_gap_s: float,
        run_as: tuple[int, int] | None = None,
        broker: BrokerClock | None = None,
        confinement: Confinement | None = None,
        output_cap_mb: float = 64,
    ):
        self.root = root
        self.lease = root / "lease"
        self.log = root / "executor.log"
        self.executor = ProcessExecutor(
            self.lease,
            self.log,
            capacity,
            grace_s=0.5,
            max_gap_s=max_gap_s,
            stderr=root / "executor.stderr",
            run_as=run_as,
            broker=broker,
            confinement=confinement,
            output_cap_mb=output_cap_mb,
        )
        self.seen: list[Event] = []

    def renew(self, seconds: float = 30) -> None:
        write_lease(self.lease, now_ms() + int(seconds * 1000))

    def start(
        self,
        name: str,
        argv: list[str],
        *,
        at_ms: int | None = None,
        at_mono: float | None = None,
        timeout_s: float = 30,
        memory_mb: int = 0,
        need: tuple[float, float, float] = (0, 0, 0),
        env: dict[str, str] | None = None,
        claimed_mono: float | None = None,
    ) -> tuple[str, int]:
        key = (name, 1)
        self.executor.start(
            StartSpec(
                key,
                self.root / name,
                tuple(argv),
                {"PATH": os.environ["PATH"], "CRONLOG_RUN_ID": name, **(env or {})},
                timeout_s,
                memory_mb,
                now_ms() if at_ms is None else at_ms,
                need,
                at_mono,
                claimed_mono,
            )
        )
        return key

    def wait(self, check: Callable[[], bool], timeout_s: float = 20, what: str = "") -> None:
        def seen_it() -> None:
            self.seen += self.executor.events()
            assert check(), f"timed out waiting for {what}; seen {self.seen}"

        until_passes(seen_it, timeout_s, interval_s=0.02)

    def passes(self, count: int, timeout_s: float = 20) -> None:
        """Until `count` reads of the executor's output after now, each with something new
        (its half-second "tick" at least; `heard` is when it last said anything). The
        first may hold ticks of a pass that began before a request just sent; the second
        was written by a later pass, of a loop that had read that request by then."""
        self.seen += self.executor.events()  # the pipe emptied: what comes was written later
        last, reads = self.executor.heard, 0

        def said_more() -> None:
            nonlocal last, reads
            self.seen += self.executor.events()
            if self.executor.heard != last:
                last, reads = self.executor.heard, reads + 1
            assert reads >= count, f"{reads} of {count} reads of the executor's output"

        until_passes(said_more, timeout_s, interval_s=0.02)

    def finished(self, key: tuple[str, int], timeout_s: float = 20) -> Finished:
        self.wait(lambda: self.result(key) is not None, timeout_s, f"{key} to finish")
        result = self.result(key)
        assert result is not None
        return result

    def result(self, key: tuple[str, int]) -> Finished | None:
        return next((e for e in self.seen if isinstance(e, Finished) and e.key == key), None)

    def started(self, key: tuple[str, int]) -> Started | None:
        return next((e for e in self.seen if isinstance(e, Started) and e.key == key), None)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def factory(
        capacity: tuple[float, float, float] = (100.0, 1e9, 10.0),
        max_gap_s: float = 2.5,
        run_as: tuple[int, int] | None = None,
        broker: BrokerClock | None = None,
        confinement: Confinement | None = None,
        output_cap_mb: float = 64,
    ) -> Harness:
        harness = Harness(tmp_path, capacity, max_gap_s, run_as, broker, confinement, output_cap_mb)
        made.append(harness)
        return harness

    yield factory
    for harness in made:
        if harness.executor.proc.poll() is None:
            harness.executor.kill()


def group_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_starts_at_its_time_with_exit_code_and_output(make: Callable[..., Harness]) -> None:
    h = make()
    h.renew()
    at = now_ms() + 700
    key = h.start("r1", ["sh", "-c", "echo out; echo err >&2; exit 3"], at_ms=at)
    result = h.finished(key)
    started = h.started(key)
    assert started is not None
    assert started.started_ms >= at
    assert (result.outcome, result.exit_code) == ("exited", 3)
    assert (h.root / "r1" / "stdout").read_text() == "out\n"
    assert (h.root / "r1" / "stderr").read_text() == "err\n"
    assert read_log(h.log)[0][key]["result"]["exit_code"] == 3  # a restarted worker reads it


def test_a_run_timed_by_the_broker_clock_starts_when_its_newest_bound_reaches_it(
    make: Callable[..., Harness],
) -> None:
    """Handed over while the worker's only sample is old (its bound carried forward a
    second behind), a run starts when the worker's fresh sample, passed on to the
    executor process, says its time has come: a second before the instant translated
    at the hand-over, and never before the bound says."""
    now = time.monotonic()

    def broker_ms(mono: float) -> int:  # the broker's true time, ticking with this clock
        return 5_000_000 + round((mono - now) * 1000)

    broker = BrokerClock()
    broker.observe(broker_ms(now - 1000), now - 1000)  # carried forward 1000 s: 1 s behind
    h = make(broker=broker)
    h.renew()
    start_ms = broker_ms(now) + 600
    handed = broker.mono_at(start_ms)
    assert handed is not None
    assert handed > now + 1.5
    key = h.start("r1", ["true"], at_ms=start_ms, at_mono=handed)
    seen = time.monotonic()
    broker.observe(broker_ms(seen), seen)  # a fresh sample: the start is 0.6 s away
    fresh = broker.mono_at(start_ms)
    assert fresh is not None
    assert fresh < handed - 0.9
    assert h.finished(key).outcome == "exited"
    started = h.started(key)
    assert started is not None
    assert started.started_mono is not None
    assert fresh <= started.started_mono < handed - 0.5


def test_a_run_starts_only_once_an_acknowledged_beat_armed_its_start_time(
    make: Callable[..., Harness],
) -> None:
    """The lease holds, the start time has come, but the horizon of the beat that renewed
    the lease is earlier: the run waits (a dead worker's verdict takes every start time
    past that horizon as never started) and starts once a beat arms it."""
    h = make()
    at = now_ms()
    write_atomic(h.lease, lease_text(time.monotonic() + 30, at - 1000))
    key = h.start("r1", ["true"], at_ms=at)
    h.passes(4)  # the start time has passed, the lease holds: several passes, no start
    assert h.started(key) is None
    armed = time.monotonic()
    write_atomic(h.lease, lease_text(time.monotonic() + 30, at))
    assert h.finished(key).outcome == "exited"
    started = h.started(key)
    assert started is not None
    assert started.started_mono is not None
    assert started.started_mono >= armed


def test_a_grant_for_a_claim_made_before_a_lapse_of_the_lease_starts_nothing(
    make: Callable[..., Harness],
) -> None:
    """The soak of issue 54: a worker cut off (inbound) past its lease claimed runs
    before the cut; the failure detector declared it dead and the ledger ended those
    claims; their grants came after the cut, with the lease renewed, and the worker ran
    them anyway (405 executions the audit called unsanctioned). A lease renewed after a
    lapse voids every claim made before: such a run ends `not_started` (the worker
    releases it, which the ledger ignores for a claim it ended) and never spawns; a run
    claimed after the renewal, queued behind it, starts."""
    h = make()
    claimed = time.monotonic()
    renewed = claimed + 0.001
    write_atomic(h.lease, lease_text(time.monotonic() + 30, now_ms() + 60_000, renewed))
    old = h.start("before", ["true"], claimed_mono=claimed)
    new = h.start("after", ["true"], claimed_mono=renewed + 0.001)
    unknown = h.start("adopted", ["true"])  # no claim time said: the lease alone
    lapsed = h.finished(old)
    assert lapsed.outcome == "not_started"
    assert "lease lapsed after its claim" in lapsed.error
    assert h.started(old) is None
    assert not (h.root / "before" / "stdout").exists()
    assert h.finished(new).outcome == "exited"
    assert h.finished(unknown).outcome == "exited"


def test_a_lease_file_says_when_it_was_renewed_after_a_lapse(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    write_atomic(lease, lease_text(time.monotonic() + 30))
    assert read_lease_file(lease).renewed_mono == 0.0
    assert not read_lease_file(lease).voids(1.0)
    write_atomic(lease, lease_text(time.monotonic() + 30, None, 100.5))
    read = read_lease_file(lease)
    assert read.armed_ms is None
    assert read.voids(100.4)
    assert not read.voids(100.5)
    assert not read.voids(None)
    # A lease file of the format before (two or three words) still reads.
    lease.write_text(f"monotonic {time.monotonic() + 30:.6f} 5000\n")
    assert read_lease_file(lease) == Lease(True, 5000, 0.0)


def test_a_lease_file_without_a_horizon_bounds_starts_by_the_lease_alone(tmp_path: Path) -> None:
    lease = tmp_path / "lease"
    write_atomic(lease, lease_text(time.monotonic() + 30))
    assert read_lease_file(lease).arms(10**15)
    write_atomic(lease, lease_text(time.monotonic() + 30, 5_000))
    assert read_lease_file(lease).arms(5_000)
    assert not read_lease_file(lease).arms(5_001)
    write_atomic(lease, lease_text(time.monotonic() - 1, 5_000))
    assert not read_lease_file(lease).arms(0)  # expired: nothing is armed


def test_a_run_s_directory_is_made_ahead_of_its_start_and_used_by_it(
    make: Callable[..., Harness],
) -> None:
    """A run handed over before its time has its directory and output files made while
    it waits (a burst's starts are then spawns only), and its output goes to them."""
    h = make()
    h.renew()
    at = now_ms() + 3_000
    key = h.start("ahead", ["sh", "-c", "echo out; echo err >&2; pwd"], at_ms=at)
    h.passes(2)  # a pass after the one that read the request
    assert h.started(key) is None
    made = h.root / "ahead"
    assert sorted(p.name for p in made.iterdir()) == ["stderr", "stdout", "work"]
    assert (made / "stdout").stat().st_mode & 0o777 == 0o600
    result = h.finished(key)
    started = h.started(key)
    assert started is not None
    assert started.started_ms >= at
    assert (result.outcome, result.exit_code) == ("exited", 0)
    assert (made / "stdout").read_text() == f"out\n{made / 'work'}\n"
    assert (made / "stderr").read_text() == "err\n"


def test_an_output_file_replaced_before_the_start_is_refused(
    make: Callable[..., Harness],
) -> None:
    """The output files made ahead are opened again at the start only as this worker's
    regular files: one replaced by a symbolic link meanwhile (nothing but the worker can
    write there; this plays it anyway) fails the start instead of writing through it."""
    h = make()
    h.renew()
    target = h.root / "elsewhere"
    target.write_text("")
    key = h.start("swap", ["sh", "-c", "echo leaked"], at_ms=now_ms() + 2_000)
    h.wait(lambda: (h.root / "swap" / "stdout").exists(), what="the output files made")
    (h.root / "swap" / "stdout").unlink()
    (h.root / "swap" / "stdout").symlink_to(target)
    result = h.finished(key)
    assert result.outcome == "error"
    assert h.started(key) is None
    assert target.read_text() == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="changing the jobs' user needs root")
def test_a_directory_made_ahead_is_the_worker_s_until_the_start(
    make: Callable[..., Harness],
) -> None:
    """Jobs run as one user (`--run-as`): another job of that user cannot leave anything
    in a run's working directory while the run waits for its time (it is the worker's
    until the start), and the run gets it, its own, at the start."""
    nobody = pwd.getpwnam("nobody")
    h = make(run_as=(nobody.pw_uid, nobody.pw_gid))
    for folder in (h.root, h.root.parent, h.root.parent.parent):
        folder.chmod(0o711)  # traversable by the job's user, as a worker's state folder is
    h.renew()
    key = h.start("later", ["sh", "-c", "stat -c %u .; ls -A"], at_ms=now_ms() + 3_000)
    work = h.root / "later" / "work"
    h.wait(work.exists, what="the directory made ahead")
    assert (work.stat().st_uid, work.stat().st_mode & 0o777) == (os.geteuid(), 0o700)
    planted = subprocess.run(
        ["touch", str(work / "planted")],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        capture_output=True,
        check=False,
    )
    assert planted.returncode != 0
    result = h.finished(key)
    assert (result.outcome, result.exit_code) == ("exited", 0)
    assert (h.root / "later" / "stdout").read_text() == f"{nobody.pw_uid}\n"


def test_a_missing_command_is_an_error_not_a_crash(make: Callable[..., Harness]) -> None:
    h = make()
    h.renew()
    bad = h.finished(h.start("bad", ["/no/such/program"]))
    assert bad.outcome == "error"
    assert "/no/such/program" in bad.error
    # A name not on the job's PATH says so, and which PATH (issue 55: it read
    # "[Errno 2] ..." or, for a folder the user could not enter, "[Errno 13] ...").
    missing = h.finished(h.start("gone", ["no-such-program-x"], env={"PATH": "/usr/bin:/bin"}))
    assert missing.outcome == "error"
    assert missing.error == "cannot start 'no-such-program-x': not found on PATH (/usr/bin:/bin)"
    good = h.finished(h.start("good", ["true"]))
    assert (good.outcome, good.exit_code) == ("exited", 0)


def test_timeout_and_cancel_kill_the_whole_group(make: Callable[..., Harness]) -> None:
    h = make()
    h.renew()
    slow = h.start("slow", ["sh", "-c", "sleep 50 & sleep 50; wait"], timeout_s=1)
    cancel = h.start("cancel", ["sh", "-c", "sleep 50 & sleep 50; wait"])
    h.wait(lambda: h.started(cancel) is not None, what="the start")
    started = h.started(cancel)
    assert started is not None
    h.executor.cancel(cancel)
    cancelled = h.finished(cancel)
    timed_out = h.finished(slow)
    assert cancelled.outcome == "cancelled"
    assert timed_out.outcome == "timeout"
    for key in (slow, cancel):
        event = h.started(key)
        assert event is not None
        assert group_gone(event.pid)


def test_leftover_processes_of_a_finished_job_are_stopped(make: Callable[..., Harness]) -> None:
    h = make()
    h.renew()
    key = h.start("left", ["sh", "-c", "sleep 60 & exit 0"])
    result = h.finished(key)
    started = h.started(key)
    assert result.outcome == "exited"
    assert result.exit_code == 0
    assert started is not None
    assert group_gone(started.pid)


def test_lease_expiry_fences_running_and_pending_runs(make: Callable[..., Harness]) -> None:
    h = make()
    h.renew(seconds=2)
    running = h.start("running", ["sleep", "60"])
    pending = h.start("pending", ["true"], at_ms=now_ms() + 60_000)
    h.wait(lambda: h.started(running) is not None, what="the start")
    fenced = h.finished(running, timeout_s=10)
    expired_at = int((h.root / "lease").read_text())
    assert fenced.outcome == "fenced"
    # Killed within the lease plus the grace (0.5 s) plus the loop's tick, with margin.
    assert fenced.finished_ms - expired_at < 1500
    assert h.finished(pending).outcome == "not_started"


def test_without_a_lease_the_executor_waits_rather_than_spins(
    make: Callable[..., Harness],
) -> None:
    """Runs fenced when the lease ran out leave their start times behind them: until a
    lease comes back (a Kafka outage) the executor ticks, it does not spin on them."""
    h = make()
    h.renew(seconds=1)
    fenced = [h.start(f"soon{i}", ["true"], at_ms=now_ms() + 1500) for i in range(3)]
    for key in fenced:
        assert h.finished(key).outcome == "not_started"  # the lease ended before their time
    time.sleep(1.0)  # their start times pass, the lease still gone
    h.passes(2)

    def cpu_s() -> float:
        fields = Path(f"/proc/{h.executor.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    before, began = cpu_s(), time.monotonic()
    time.sleep(2.0)
    used = cpu_s() - before
    # A spin takes a core (~2 s in 2 s); ticking every 0.1 s takes a few hundredths.
    assert used < 0.5 * (time.monotonic() - began), f"{used:.2f} s of CPU in 2 s"


def test_nothing_starts_before_a_first_lease(make: Callable[..., Harness]) -> None:
    h = make()
    key = h.start("early", ["true"])
    # The moment has passed once a pass of the executor's loop ran with the request read
    # and the run due (its time is now): two reads of its ticks after the request.
    h.passes(2)
    assert h.started(key) is None
    h.renew()
    assert h.finished(key).outcome == "exited"


def test_worker_gone_pending_dropped_running_fenced_at_lease_end(
    make: Callable[..., Harness],
) -> None:
    h = make()
    h.renew(seconds=2)
    running = h.start("running", ["sleep", "60"])
    pending = h.start("pending", ["true"], at_ms=now_ms() + 60_000)
    h.wait(lambda: h.started(running) is not None, what="the start")
    started = h.started(running)
    assert started is not None
    h.executor.close()  # what a SIGKILLed worker leaves: its end of the pipe closed

    def gone() -> None:
        assert group_gone(started.pid)

    until_passes(gone, 10, interval_s=0.05)
    h.executor.proc.wait(10)  # it exits once nothing is left to guard
    written = read_log(h.log)[0]
    assert written[running]["result"]["outcome"] == "fenced"
    assert written[pending]["result"]["outcome"] == "not_started"


def test_a_paused_executor_fences_everything_when_it_runs_again(
    make: Callable[..., Harness],
) -> None:
    h = make(max_gap_s=1.0)
    h.renew()
    running = h.start("running", ["sleep", "60"])
    h.wait(lambda: h.started(running) is not None, what="the start")
    os.kill(h.executor.pid, signal.SIGSTOP)
    time.sleep(2.0)
    h.renew()  # the worker renewed meanwhile: the executor still cannot vouch for the gap
    os.kill(h.executor.pid, signal.SIGCONT)
    result = h.finished(running)
    assert result.outcome == "fenced"
    assert "did not run" in result.error


def test_memory_limit(make: Callable[..., Harness]) -> None:
    h = make()
    h.renew()
    grab = [sys.executable, "-c", "x = bytearray(400 * 1024 * 1024); print(len(x))"]
    small = h.finished(h.start("small", grab, memory_mb=200))
    assert small.outcome == "exited"
    assert small.exit_code != 0
    assert "MemoryError" in (h.root / "small" / "stderr").read_text()
    large = h.finished(h.start("large", grab, memory_mb=2048))
    assert (large.outcome, large.exit_code) == ("exited", 0)


def test_a_run_waits_for_room_at_its_start(make: Callable[..., Harness]) -> None:
    h = make(capacity=(1.0, 1e9, 10.0))
    h.renew()
    first = h.start("first", ["sleep", "0.8"], need=(1.0, 0, 0))
    # Due 100 ms later: two runs due in the same millisecond may start in either order
    # (the start heap compares their times converted to the monotonic clock).
    second = h.start("second", ["true"], at_ms=now_ms() + 100, need=(0.6, 0, 0))
    a, b = h.finished(first), h.finished(second)
    assert a.outcome == b.outcome == "exited"
    assert a.started_ms is not None
    assert b.started_ms is not None
    assert a.started_ms <= b.started_ms
    assert b.started_ms >= a.finished_ms - 50


def test_executor_killed_leaves_a_readable_log(make: Callable[..., Harness]) -> None:
    h = make()
    h.renew()
    key = h.start("k", ["sleep", "60"])
    h.wait(lambda: h.started(key) is not None, what="the start")
    started = h.started(key)
    assert started is not None
    h.executor.kill()
    assert "started" in read_log(h.log)[0][key]  # the worker knows the group to kill
    assert pid_alive(started.pid)
    os.killpg(started.pid, signal.SIGKILL)


def test_jobs_are_children_of_the_executor_itself(make: Callable[..., Harness]) -> None:
    """No process per run besides the job: the job's parent is the executor."""
    h = make()
    h.renew()
    keys = [h.start(f"many{i}", ["sh", "-c", "echo $PPID"]) for i in range(20)]
    for key in keys:
        assert h.finished(key).exit_code == 0
        assert (h.root / key[0] / "stdout").read_text().strip() == str(h.executor.pid)


def test_a_burst_due_at_once_keeps_the_executor_responsive(
    make: Callable[..., Harness],
) -> None:
    """400 runs due in the same millisecond: all start and exit 0, none is fenced for a
    'pause' of the loop, and the executor never looks dead to its worker meanwhile."""
    h = make()
    h.renew()
    at = now_ms() + 300
    keys = [h.start(f"b{i}", ["true"], at_ms=at) for i in range(400)]
    problems: list[str] = []

    def done() -> bool:
        if problem := h.executor.health():
            problems.append(problem)
        return all(h.result(k) is not None for k in keys)

    h.wait(done, timeout_s=60, what="the burst")
    assert problems == []
    outcomes = Counter((r.outcome, r.exit_code) for k in keys if (r := h.result(k)))
    assert outcomes == Counter({("exited", 0): 400})


def test_jobs_get_default_signals_and_their_own_path(
    make: Callable[..., Harness], tmp_path: Path
) -> None:
    """The executor (Python) ignores SIGPIPE; its jobs must not inherit that. And the
    program is looked up in the job's own PATH, as subprocess would."""
    h = make()
    h.renew()
    key = h.start("sigs", ["sh", "-c", "grep SigIgn /proc/$$/status"])
    assert h.finished(key).exit_code == 0
    ignored = int((h.root / "sigs" / "stdout").read_text().split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "only-here"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    h.executor.start(
        StartSpec(
            ("own-path", 1),
            h.root / "own-path",
            ("only-here",),
            {"PATH": f"{bindir}:/usr/bin:/bin"},
            30,
            0,
            now_ms(),
            (0, 0, 0),
        )
    )
    assert h.finished(("own-path", 1)).exit_code == 0
    assert (h.root / "own-path" / "stdout").read_text() == "found\n"


def test_the_log_is_read_from_where_the_last_read_stopped(tmp_path: Path) -> None:
    log = tmp_path / "executor.log"
    log.write_bytes(
        b'{"ev":"starting","key":["a",1]}\n{"ev":"started","key":["a",1],"pid":7}\n'
        b'{"ev":"started","key":["b",1],"pid":8}\n{"ev":"finished","key":["a"'
    )
    seen, offset = read_log(log, {("a", 1)})
    assert set(seen) == {("a", 1)}
    assert "result" not in seen[("a", 1)]  # the torn line is not read yet
    with open(log, "ab") as f:
        f.write(b',1],"result":{"outcome":"exited","exit_code":0}}\n')
    seen, offset = read_log(log, {("a", 1)}, offset, seen)
    assert seen[("a", 1)]["result"]["exit_code"] == 0
    assert seen[("a", 1)]["started"]["pid"] == 7
    assert offset == log.stat().st_size
