"""Two executions at once (``overlapping_attempts``), by the workers' own word.

Overlaps. On the ledger's own view two attempts of one run never overlap: a run's
events are one sequence and a new attempt begins only from ``retrying`` or a final
state, so anything else is an ``illegal_transition`` already. What is checkable:

- from run-events: a run of a job with concurrency ``forbid`` or ``replace`` created by
  its schedule while another run of the job is live (not final) on the ledger's view
  (the ledger skips such a firing, or cancels the live runs first). Counted from the runs
  seen, so a ``--from`` window misses runs live before it but flags nothing wrongly.
  Revivals and reruns are not checked (the ledger does not apply the policy to reruns,
  and run-events does not tell the two apart), nor manual, backfill and dependency runs
  (the ledger does not apply it to them). Checked as the runs are created
  (`connectors/audit/run_events.py`);
- with the reports: a sanctioned execution whose worker's ``RunFinished`` says it ended
  (its ``at_ms``, the end on the worker's clock) more than `clock_tolerance_ms` after the
  ledger recorded the start of a later attempt of the same run, or, for a ``forbid`` job,
  of a run of its schedule scheduled after it whose firing was decided while the job's
  policy was ``forbid`` (a rerun of an earlier time, the operator's, may run beside it:
  ``forbid`` governs the schedule's firings only). A firing is judged by the policy in
  force when the ledger decided it (its run's creation, or its revival): ``forbid``
  forbids a run decided under it from starting beside another run of the job, and a run
  decided earlier under ``allow`` keeps its decision after a switch to ``forbid`` (the
  switch withdraws only the runs created ahead of their time, decided again under it).
  The run scheduled later is the one decided later: the ledger decides firings in time
  order. Not from a report of a ``lost`` outcome (its time is the report's: the end is
  unknown).
  ``replace`` is not checked here: the ledger starts the new run while the old one is
  being stopped. Here: the starts indexed once run-events are complete (`index_starts`),
  and the later start an execution ran into (`overlap_detail`); the reports are read by
  `connectors/audit/worker_reports.py`.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterable
from typing import Final

from connectors.audit.history import ATTEMPT_MASK, DECIDED_UNDER_ALLOW, AuditedJob, AuditedRun
from schemas.records import RunFinished
from streams.core.ids import iso_utc

# Worker reports whose at_ms is the report's time, not the execution's end.
END_UNKNOWN: Final = ("lost",)


def index_starts(jobs: Iterable[AuditedJob]) -> None:
    """Run-events are complete: index the starts of `forbid` jobs (`AuditedJob.sealed`):
    those of runs of the schedule decided under `forbid` by time (the later starts an
    execution may run into), all of them by run (an execution's own start)."""
    for job in jobs:
        if not job.starts:
            continue
        raw = job.starts
        n = len(raw) // 3
        by_run = sorted(range(n), key=lambda i: (raw[3 * i], raw[3 * i + 2]))
        by_time = sorted(
            (i for i in range(n) if 0 < raw[3 * i + 2] < DECIDED_UNDER_ALLOW),
            key=lambda i: raw[3 * i + 1],
        )
        job.sealed = (
            array("q", (raw[3 * i + 1] for i in by_time)),
            array("q", (raw[3 * i] for i in by_time)),
            array("q", (raw[3 * i] for i in by_run)),
            array("q", (raw[3 * i + 2] for i in by_run)),
            array("q", (raw[3 * i + 1] for i in by_run)),
        )
        job.starts = array("q")


def overlap_detail(
    job: AuditedJob,
    run: AuditedRun,
    inp: RunFinished,
    later_starts: dict[str, tuple[int, ...]],
    clock_tolerance_ms: int,
) -> str | None:
    """A sanctioned execution still going, by its worker's word, after the ledger
    started a later attempt of the run or a later run of a `forbid` job: the finding's
    detail, or None."""
    if inp.error.startswith(END_UNKNOWN):
        return None
    end = inp.at_ms - clock_tolerance_ms
    later: tuple[int, int] | None = None  # (start, attempt)
    starts = later_starts.get(inp.run_id, ())
    for i in range(0, len(starts), 2):
        attempt, start = starts[i], starts[i + 1]
        if attempt > inp.attempt and start < end and (later is None or start < later[0]):
            later = (start, attempt)
    if later is not None:
        what = f"attempt {later[1]} started at {iso_utc(later[0])}"
    else:
        other = _other_start(job, run.scheduled_ms, inp.attempt, end)
        if other is None:
            return None
        what = f"run of the job for {iso_utc(other[1])} (concurrency forbid) started at "
        what += iso_utc(other[0])
    return (
        f"attempt {inp.attempt} on {inp.worker_id} ended at {iso_utc(inp.at_ms)} by its "
        f"report, but the ledger's {what}"
    )


def _other_start(
    job: AuditedJob, scheduled: int, attempt: int, until: int
) -> tuple[int, int] | None:
    """(start, scheduled time) of a run of a `forbid` job's schedule for a time after
    `scheduled`, decided under `forbid`, that the ledger started after its `attempt` and
    before `until`. Under `forbid` the ledger decides to run a firing only once every run
    is final on its view; a rerun (of an earlier time) is the operator's and may run
    beside a later run, and so may a run decided before the switch to `forbid`."""
    if job.sealed is None:
        return None
    at, times, runs, attempts, starts = job.sealed
    i = bisect.bisect_left(runs, scheduled)
    own = None
    while i < len(runs) and runs[i] == scheduled:
        if abs(attempts[i]) & ATTEMPT_MASK == attempt:
            own = starts[i]
            break
        i += 1
    if own is None:
        return None  # its start is not on run-events: its outcome was accepted instead
    j = bisect.bisect_right(at, own)
    while j < len(at) and at[j] < until:
        if times[j] > scheduled:
            return at[j], times[j]
        j += 1
    return None
