"""What a worker does about what it cannot see finish: an executor that died or hangs
(`replace_executor`), and what an earlier incarnation left (`recover`, `check_adopted`):
claims asked again, started attempts read from their executor's log (the outcome is
reported), waited for while that executor lives (it fences them when its lease, which
nobody renews now, expires), or else reported lost (their processes killed) or
released. Mixed into `Worker` (connectors/worker/worker.py), whose state it uses."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from connectors.stack.process import pid_alive
from connectors.worker.config import Attempt, Key
from connectors.worker.engine import read_log
from connectors.worker.executor import Executor, Finished
from connectors.worker.journal import Entry, Journal
from connectors.worker.procs import job_processes, signal_group
from schemas.json import from_plain
from schemas.records import DispatchRequest
from streams.core.clock import BrokerClock, Clock
from streams.core.timeline import DurationEstimates, Timeline

log = logging.getLogger("cronlog.worker")


class Recovery:
    """The worker's recovery, as methods of `Worker` (the state below is its)."""

    attempts: dict[Key, Attempt]
    adopted: dict[Key, tuple[Attempt, Entry]]
    adopted_logs: dict[str, tuple[dict[Key, dict[str, Any]], int]]
    executor: Executor
    journal: Journal
    timeline: Timeline
    durations: DurationEstimates
    broker: BrokerClock
    clock: Clock
    lease: Path
    dir: Path

    if TYPE_CHECKING:

        def _new_executor(self) -> Executor: ...
        def _finished(self, attempt: Attempt, event: Finished) -> None: ...
        def _report(
            self,
            attempt: Attempt,
            code: int | None,
            error: str,
            at_ms: int,
            started_ms: int | None = None,
        ) -> None: ...
        def _release(self, attempt: Attempt, why: str) -> None: ...
        def _claim(self, d: DispatchRequest) -> int: ...
        def _at(self, mono: float | None, wall_ms: int) -> int: ...
        def _now_ms(self) -> int: ...

    def _replace_executor(self, why: str) -> None:
        """The executor died or hangs: kill it and the job groups it ran; report what
        started as lost and release what had not; then start a new one."""
        old = self.executor
        log.error("executor %d unusable (%s): replacing it", old.pid, why)
        old.kill()
        written = read_log(Path(old.log_path))[0] if old.log_path else {}
        for attempt in [a for a in self.attempts.values() if a.executor is old]:
            self._from_log(attempt, written.get(attempt.key, {}), f"the executor failed: {why}")
        with contextlib.suppress(OSError):
            self.lease.unlink()
        self.executor = self._new_executor()

    def _from_log(self, attempt: Attempt, entry: dict[str, Any], why: str) -> None:
        """Settle an attempt from what its (dead) executor's log says of it."""
        result = entry.get("result")
        if result is not None:
            self._finished(attempt, Finished.of(attempt.key, result))
        elif "started" in entry or "starting" in entry or attempt.pid:
            # It started, or may have (the executor died between the two lines): what is
            # left of it must not run on, and whether it did its work is unknown.
            d = attempt.dispatch
            started = entry.get("started") or {}
            pid = attempt.pid or int(started.get("pid", 0))
            for leader in [pid] if pid else job_processes(d.run_id, d.attempt):
                _kill_job(leader, d.run_id)
            # A start its log holds and no report told (an earlier incarnation's, whose
            # start report was still waiting): reported with the loss.
            unreported = None
            if attempt.started_ms is None and isinstance(started.get("started_ms"), int):
                mono = started.get("started_mono")
                unreported = self._at(
                    mono if isinstance(mono, float) else None, started["started_ms"]
                )
            self._report(attempt, None, f"lost: {why}", self._now_ms(), unreported)
        else:
            self._release(attempt, f"never started: {why}")

    def _recover(self) -> None:
        """Settle what an earlier incarnation left: claims are asked again (a reply may
        have been lost); started attempts are read from their executor's log (the outcome
        is reported), waited for while that executor lives (it fences them when its lease,
        which nobody renews now, expires), or else reported lost / released."""
        for entry in self.journal.unfinished():
            d = from_plain(entry.info["dispatch"], DispatchRequest)
            attempt = Attempt(d, entry.phase)
            self.attempts[attempt.key] = attempt
            if entry.phase == "claiming":
                expected = self.durations.expected_ms(d.job_id)
                self.timeline.plan(attempt.key, d.resources, d.not_before_ms, expected)
                attempt.since, attempt.claimed_ms = self.clock.monotonic(), self._claim(d)
                attempt.claimed_mono = time.monotonic()  # a later lapse voids it too
                continue
            attempt.run_dir = Path(entry.info["run_dir"]) if entry.info.get("run_dir") else None
            self.timeline.begin(attempt.key, d.resources)  # may be running: hold it
            self.adopted[attempt.key] = (attempt, entry)
        self._check_adopted()
        for stale in self.dir.glob("lease.*"):
            pid = _executor_pid_of(stale, self.journal)
            if pid is None or not _is_executor(pid):
                with contextlib.suppress(OSError):
                    stale.unlink()

    def _check_adopted(self) -> None:
        """Read what is new in each earlier executor's log for the attempts still waited
        on; settle those it finished, or whose executor is gone. Not before the broker's
        time is known: the reports carry it."""
        if not self.broker.synced:
            return
        wanted, read_now = set(self.adopted), set()
        for key, (attempt, entry) in list(self.adopted.items()):
            path = str(entry.info.get("executor_log") or "")
            written: dict[str, Any] = {}
            if path:
                seen, offset = self.adopted_logs.get(path, ({}, 0))
                if path not in read_now:
                    seen, offset = read_log(Path(path), wanted, offset, seen)
                    self.adopted_logs[path] = (seen, offset)
                    read_now.add(path)
                written = seen.get(key, {})
            pid = int(entry.info.get("executor_pid") or 0)
            if "result" not in written and pid and _is_executor(pid):
                continue  # it still guards the run: wait for its outcome
            self._from_log(attempt, written, "the worker restarted and the run's executor was gone")
        if not self.adopted:
            self.adopted_logs.clear()


def _executor_pid_of(lease: Path, journal: Journal) -> int | None:
    """The pid of the executor that guards `lease` (lease.N goes with executor.N.log)."""
    suffix = lease.name.removeprefix("lease.")
    wanted = str(lease.parent / f"executor.{suffix}.log")
    for entry in journal.entries.values():
        if entry.info.get("executor_log") == wanted:
            return int(entry.info.get("executor_pid") or 0) or None
    return None


def _kill_job(pid: int, run_id: str) -> None:
    """SIGKILL the process group of a job whose executor died, if its leader is still
    that job (its environment names the run): never a group that reused the pid."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return  # the leader is gone; what it left in its group is not ours to guess
    if f"CRONLOG_RUN_ID={run_id}".encode() in environ.split(b"\0"):
        signal_group(pid, signal.SIGKILL)  # its group, if it leads one
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _is_executor(pid: int) -> bool:
    if not pid_alive(pid):
        return False
    try:
        return b"connectors.worker.engine" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
