"""Restore: how long a ledger takes to rebuild its state from the compacted topics, and
whether that grows with the history still in them (superseded values not yet compacted).

J jobs, each with V successive job states on `jobs`, and R live runs with V successive run
states each on `runs` (real encodings, as the ledger writes them; min.compaction.lag keeps
them all in the log). Then a real `Ledger` restores every partition with the code of a
takeover (`Takeover.restore_all`, streams/ledger_takeover.py), timed, with the number of
jobs and runs it ends up holding checked against what was written, and the process's peak
resident memory. Then a real `Scheduler` takes the same partitions over: the time until it
holds every job's timer with its newest due time (its catch-up).
`python -m bench.restore --jobs 20000 --versions 1,10` (`--quick`: the same).
"""

from __future__ import annotations

import argparse
import resource
import threading
import time

import orjson
from confluent_kafka import Producer

from bench.common import bench_settings, report, table
from schemas.codec import JOB_STATE, RUN_STATE
from schemas.records import JobState, RunState
from streams.core.commands import UpsertJob, parse_command
from streams.headers import job_state_headers, run_state_headers
from streams.kafka import producer_config
from streams.ledger import Ledger
from streams.scheduler import Scheduler
from streams.settings import Settings


def spec_of(job_id: str) -> UpsertJob:
    command = parse_command(
        orjson.dumps(
            {
                "type": "job.upsert",
                "job_id": job_id,
                "owner": "o",
                "schedule": {"cron": "5 * * * *", "timezone": "Europe/Berlin"},
                "command": ["sh", "-c", "echo restore"],
            }
        )
    )
    assert isinstance(command, UpsertJob)
    return command


def due_of(version: int) -> int:
    return 3_600_000 + version


def fill(
    settings: Settings, jobs: int, runs_per_job: int, versions: int, bare: bool = False
) -> None:
    """Write every job's and run's `versions` successive states (the last one wins), each
    with the header the ledger writes for the scheduler (`bare`: without, as records
    written before the headers existed)."""
    producer = Producer(producer_config(settings, **{"linger.ms": 50}))
    jobs_topic, runs_topic = settings.topic("jobs"), settings.topic("runs")
    for i in range(jobs):
        job_id = f"rs-{i:07d}"
        spec = spec_of(job_id).spec
        run_ids = [f"{job_id}@2026-12-01T10:{k:02d}:00Z" for k in range(runs_per_job)]
        for v in range(versions):
            # Each value its own next due time: the newest one tells a complete catch-up.
            state = JobState(spec, False, False, 1, v, v, due_of(v), tuple(run_ids), (), (), v)
            producer.produce(
                jobs_topic,
                key=job_id.encode(),
                value=JOB_STATE.encode(state),
                headers=None if bare else job_state_headers(state),
            )
            for run_id in run_ids:
                run = RunState(
                    run_id, job_id, 1, "schedule", "due", 1, "", 1, v, None, None, None, None,
                    None, "", v,
                )  # fmt: skip
                producer.produce(
                    runs_topic,
                    key=run_id.encode(),
                    value=RUN_STATE.encode(run),
                    headers=None if bare else run_state_headers(run),
                )
        if i % 1000 == 0:
            producer.poll(0)
            while len(producer) > 100_000:
                producer.poll(0.05)
    assert producer.flush(120) == 0


def scheduler_catch_up(settings: Settings, jobs: int, versions: int) -> tuple[float, float]:
    """(seconds until the group assigned every partition to a fresh scheduler, seconds
    from then until it holds every one of the `jobs` with its newest due time: its
    catch-up, whatever way it reads)."""
    scheduler = Scheduler(settings, "bench-restore", propose_at=lambda: 0)
    started = time.monotonic()
    assigned = 0.0
    newest = due_of(versions - 1)
    thread = threading.Thread(target=scheduler.run, daemon=True)
    thread.start()
    try:
        while time.monotonic() - started < 600:
            timers = list(scheduler.timers.values())
            if not assigned and len(timers) == settings.partitions:
                assigned = time.monotonic()
            held = sum(len(t.fires) for t in timers)
            if (
                assigned
                and held == jobs
                and all(d == newest for t in timers for d in t.fires.due.values())
            ):
                return assigned - started, time.monotonic() - assigned
            time.sleep(0.05)
        raise AssertionError("the scheduler never caught up")
    finally:
        scheduler.stop()
        thread.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--runs-per-job", type=int, default=1)
    parser.add_argument("--versions", default="1,10", help="states per key, one scenario each")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--bare", action="store_true", help="states written without the scheduler's headers"
    )
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    for versions in [int(v) for v in args.versions.split(",")]:
        with bench_settings(f"restore{versions}") as settings:
            started = time.monotonic()
            fill(settings, args.jobs, args.runs_per_job, versions, args.bare)
            filled_s = time.monotonic() - started
            ledger = Ledger(settings, node_id=f"bench-restore-{versions}")
            try:
                started = time.monotonic()
                states = ledger.takeover.restore_all(list(range(settings.partitions)))
                restore_s = time.monotonic() - started
            finally:
                ledger.consumer.close()
            join_s, catch_up_s = scheduler_catch_up(settings, args.jobs, versions)
            held_jobs = sum(len(s.jobs) for s in states.values())
            held_runs = sum(len(s.runs) for s in states.values())
            assert held_jobs == args.jobs, (held_jobs, args.jobs)
            assert held_runs == args.jobs * args.runs_per_job, held_runs
            records = versions * args.jobs * (1 + args.runs_per_job)
            rows.append(
                {
                    "versions_per_key": versions,
                    "headers": not args.bare,
                    "records": records,
                    "jobs": held_jobs,
                    "runs": held_runs,
                    "fill_s": filled_s,
                    "restore_s": restore_s,
                    "records_per_s": records / restore_s,
                    "scheduler_join_s": join_s,
                    "scheduler_catch_up_s": catch_up_s,
                    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                }
            )
            del states
    table("restore (one ledger, every partition)", rows)
    report("restore", {"scenarios": rows})


if __name__ == "__main__":
    main()
