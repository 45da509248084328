"""The ledger's CPU cost per run, in process: no broker, no other process.

N jobs of one schedule kind each go through one firing: the proposal, the claim, the
start and the finish, decided by `streams.core.ledger.decide` and every output encoded
as the ledger produces it. This is the per-record Python work that limits the burst and
sustained figures on a small machine (docs/performance.md); the other scenarios measure
it with Kafka around it. `python -m bench.ledger --jobs 5000`.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import report, table
from schemas.codec import DISPATCH, JOB_LOG, JOB_STATE, RUN_EVENTS, RUN_STATE, WORKER_INBOX
from schemas.records import (
    ClaimRequested,
    FireProposed,
    JobState,
    JobUpserted,
    LedgerInput,
    RunFinished,
    RunStarted,
    RunState,
)
from streams.core.commands import UpsertJob, validate_command
from streams.core.ledger import Decision, LedgerConfig, decide
from streams.core.schedule import next_fire

T0 = 1_800_000_000_000
SCHEDULES: dict[str, dict[str, Any]] = {
    # What a top-of-the-hour burst looks like: one expression, a zone with DST.
    "cron": {"cron": "0 * * * *", "timezone": "Europe/Berlin"},
    "every": {"every": "1h"},
    "at": {"at": "2027-01-15T09:00:00Z"},
}


class Ledger:
    """decide() plus what the ledger adapter does with a decision, without Kafka."""

    def __init__(self) -> None:
        self.config = LedgerConfig()
        self.jobs: dict[str, JobState] = {}
        self.runs: dict[str, RunState] = {}
        self.records = 0

    def apply(self, inp: LedgerInput, job_id: str) -> Decision:
        d = decide(self.jobs.get(job_id), self.runs.get, inp, self.config)
        if d.job is not None:
            self.jobs[job_id] = d.job
            JOB_STATE.encode(d.job)
        for run in d.runs:
            self.runs[run.run_id] = run
            RUN_STATE.encode(run)
        for gone in d.forget:
            self.runs.pop(gone, None)
        for event in d.events:
            RUN_EVENTS.encode(event)
        for reply in d.replies:
            WORKER_INBOX.encode(reply)
        for notice in d.notices:
            JOB_LOG.encode(notice)
        for request in d.dispatch:
            DISPATCH.encode(request)
        self.records += (
            (d.job is not None)
            + len(d.runs)
            + len(d.forget)
            + len(d.events)
            + len(d.replies)
            + len(d.notices)
            + len(d.dispatch)
        )
        return d


def measure(kind: str, jobs: int) -> dict[str, object]:
    ledger = Ledger()
    ids = [f"job-{i}" for i in range(jobs)]
    for job_id in ids:
        command = validate_command(
            {
                "type": "job.upsert",
                "job_id": job_id,
                "owner": "bench",
                "command": ["true"],
                "schedule": SCHEDULES[kind],
            }
        )
        assert isinstance(command, UpsertJob)
        ledger.apply(JobUpserted(command.spec, T0), job_id)
    first = ledger.jobs[ids[0]]
    due = next_fire(first.spec.schedule, T0, first.spec.dst)
    assert due is not None
    ledger.records = 0
    started = time.perf_counter()
    run_of: dict[str, str] = {}
    for job_id in ids:
        fired = ledger.apply(FireProposed(job_id, due, due - 1000, "bench"), job_id)
        run_of[job_id] = fired.runs[0].run_id
    for job_id in ids:
        ledger.apply(ClaimRequested(job_id, run_of[job_id], 1, "w", due + 10), job_id)
    for job_id in ids:
        ledger.apply(RunStarted(job_id, run_of[job_id], 1, "w", due + 20), job_id)
    for job_id in ids:
        ledger.apply(RunFinished(job_id, run_of[job_id], 1, "w", 0, "", due + 30), job_id)
    elapsed = time.perf_counter() - started
    assert all(ledger.runs[r].state == "succeeded" for r in run_of.values())
    return {
        "schedule": kind,
        "runs": jobs,
        "seconds": round(elapsed, 3),
        "runs_per_s": round(jobs / elapsed),
        "us_per_run": round(elapsed / jobs * 1e6),
        "records_per_run": round(ledger.records / jobs, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--schedule", choices=sorted(SCHEDULES), action="append")
    args = parser.parse_args()
    rows = [measure(kind, args.jobs) for kind in args.schedule or list(SCHEDULES)]
    table("ledger CPU per run (fire, claim, start, finish; one core)", rows)
    report("ledger", {"rows": rows})


if __name__ == "__main__":
    main()
