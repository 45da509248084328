"""The worker reports on `job-log`, judged against the ledger's record on run-events
(``unsanctioned_execution``; the overlaps they reveal: `connectors/audit/overlaps.py`).

Worker reports. A worker reports on `job-log` (its claims, ``RunStarted``,
``RunFinished``, ``RunReleased``); the ledger accepts a start only from the worker
holding the current attempt of a live, claimed run, and records it as ``running``. A
report the ledger rejected leaves no trace on run-events, so the audit reads the reports
too. Run-events sanctions, per (run, attempt, worker), an execution by that worker if it
has a ``running`` event of the attempt by it, or if the ledger accepted its outcome
while it held the claim (a transition out of ``dispatched`` with an exit code: its start
report was lost or came late). Evidence of an execution is a ``RunStarted``, or a
``RunFinished`` with an exit code (a process ran and exited) or with its start
(``started_ms``: one report for both, the ledger records the start from it first). An
execution without a sanction is an ``unsanctioned_execution``, reported once per (run,
attempt, worker) at its first report, saying why:

- the worker never held the attempt: it ran something nobody granted it (a run id
  run-events never had, for a registered job, included);
- it held the attempt, and the ledger had released the claim (by the worker's release,
  or the worker declared dead before the run's start time): the ledger relied on the
  attempt never having started and dispatched it again;
- it held the attempt, and by the report's own time (the worker's clock, give or take
  `clock_tolerance_ms`) it started after the ledger cancelled the claim or ended it
  without a start (a dead verdict, the timeout backstop, its own report without an exit
  code), or, but for a cancel (whose run is stopped after it), was still running then:
  it ran beside whatever the ledger did next.

Not findings, by construction: a duplicate or late report of a sanctioned execution
(same worker, same attempt), whatever the run's state when it came; claims (a refused
claim is not an execution), releases, a ``RunFinished`` without an exit code from a
worker that never ran the attempt; an execution under way before the ledger cancelled
the claim or declared it lost, whose report came after (the ledger's record covers it:
cancelled; lost, whether it did its work unknown); reports the ledger has not decided
yet (the reader passes only reports below the ledger group's committed offsets, or, when
those are unknown, older than the partition's newest run-event by `safety_margin_ms`;
and the start of the holder of a claim still open at the end is in flight); reports on
runs the replay cannot judge (a run whose events begin before a ``--from`` window, for
its attempts up to the first seen; a job whose registration is not in the replay). A run
the ledger forgot is still on run-events: its late reports are judged like any other.
The check is per execution, not per moment: a start rejected as premature by a worker
granted the attempt just after is not told apart from its granted start.
"""

from __future__ import annotations

from typing import Final

from connectors.audit.config import AuditConfig
from connectors.audit.findings import Findings
from connectors.audit.grants import CANCELLED, ENDED_HOW, HELD, LOST, RAN, flags, holders, holds
from connectors.audit.history import AuditedJob, AuditedRun, History
from connectors.audit.overlaps import END_UNKNOWN, overlap_detail
from schemas.records import RunFinished, RunStarted
from streams.core.ids import iso_utc

# Findings about executions remembered to report each one once.
_MAX_FLAGGED: Final = 100_000


class WorkerReports:
    """The judgement of one replay's worker reports, once run-events are complete."""

    def __init__(self, config: AuditConfig, history: History, findings: Findings) -> None:
        self._config = config
        self._jobs = history.jobs
        self._runs = history.runs
        self._midlife = history.midlife
        self._ended = history.ended
        self._later_starts = history.later_starts
        self._violate = findings.violate
        self.judged = 0  # reports judged against run-events
        self.unjudged = 0  # undecided yet, or about runs the replay cannot judge
        self.note = ""  # why no worker reports were read, if none were
        self._flagged: set[tuple[str, str, int, str]] = set()

    def judge(
        self, inp: RunStarted | RunFinished, partition: int, offset: int, *, decided: bool
    ) -> None:
        """One report of an execution, in log order (`decided=False`: the ledger may not
        have decided it yet: counted, not judged)."""
        if not decided:
            self.unjudged += 1
            return
        job = self._jobs.get(inp.job_id)
        run = self._runs.get(inp.run_id)
        first_seen = self._midlife.get(inp.run_id)
        if (
            job is None
            or (run is None and (job.spec is None or self._config.partial))
            or (first_seen is not None and inp.attempt <= first_seen)
        ):
            self.unjudged += 1  # the replay does not know this run's life
            return
        worker = inp.worker_id
        found = 0 if run is None else flags(run.grants, run.gbits, inp.attempt, worker)
        if run is not None and not found & RAN and holds(run, inp.attempt, worker):
            self.unjudged += 1  # the holder of a claim still open: its start in flight
            return
        self.judged += 1
        if found & RAN:
            if isinstance(inp, RunFinished) and run is not None:
                self._overlap(job, run, inp, partition, offset)
            return
        # The execution's start and exit that the report tells of (a finish of a short
        # run tells both: `started_ms`).
        started = inp.at_ms if isinstance(inp, RunStarted) else inp.started_ms
        exited = None if isinstance(inp, RunStarted) or inp.exit_code is None else inp.at_ms
        if started is None and exited is None:
            return  # killed before it ran, or never started: not an execution
        # When it ended, by the worker: its exit, or the kill of a run it started (a
        # timeout, a fence); a `lost` report's time is when the worker learnt of it.
        stopped = exited
        if isinstance(inp, RunFinished) and started is not None and stopped is None:
            stopped = None if inp.error.startswith(END_UNKNOWN) else inp.at_ms
        code = None if isinstance(inp, RunStarted) else inp.exit_code
        what = " and ".join(
            ([] if started is None else ["started"])
            + ([] if exited is None else [f"exited {code}"])
        )
        if run is None:
            why = f"run-events has no run {inp.run_id}"
        elif found & HELD:
            ended = [x for x in self._ended.get(inp.run_id, ()) if x[:2] == (inp.attempt, worker)]
            how, at = ended[-1][2:] if ended else (None, 0)
            # Under way before the ledger ended the claim, which covers it: its start then
            # and, for a lost claim, its exit (a run stopped by its cancel ends after it).
            times = [t for t in (started, stopped if how == LOST else None) if t is not None]
            if how in (CANCELLED, LOST) and all(
                t <= at + self._config.clock_tolerance_ms for t in times
            ):
                return
            why = (
                f"it held the attempt, but the ledger never recorded its start: the claim was "
                f"{ENDED_HOW[how]} at {iso_utc(at)}"
                if how is not None
                else f"it held the attempt, but the ledger never recorded its start (the run "
                f"is {run.state}, attempt {run.attempt})"
            )
        else:
            held_by = holders(run.grants, run.gbits, inp.attempt)
            why = f"it never held the attempt (held by {', '.join(held_by) or 'nobody'})"
        if not self._once("unsanctioned", inp):
            return
        self._violate(
            "unsanctioned_execution",
            inp.job_id,
            inp.run_id,
            partition,
            offset,
            f"worker {worker} {what} attempt {inp.attempt}: {why}",
            "job-log",
        )

    def _overlap(
        self, job: AuditedJob, run: AuditedRun, inp: RunFinished, partition: int, offset: int
    ) -> None:
        detail = overlap_detail(job, run, inp, self._later_starts, self._config.clock_tolerance_ms)
        if detail is None or not self._once("overlap", inp):
            return
        self._violate(
            "overlapping_attempts", inp.job_id, inp.run_id, partition, offset, detail, "job-log"
        )

    def _once(self, kind: str, inp: RunFinished | RunStarted) -> bool:
        """Whether this is the first finding of `kind` about this execution."""
        key = (kind, inp.run_id, inp.attempt, inp.worker_id)
        if key in self._flagged:
            return False
        if len(self._flagged) < _MAX_FLAGGED:
            self._flagged.add(key)
        return True
