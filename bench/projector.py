"""Projector throughput and cost: N synthetic run transitions produced to run-events, with
each run's job state as the ledger writes it on `jobs` (at the firing, its next due time
moved; at the end, its run lists), then the time and CPU for a fresh projector to write
them all into PostgreSQL: its process (the projector is its one busy thread) and
PostgreSQL's, per run. `python -m bench.projector --events 100000`."""

from __future__ import annotations

import argparse
import dataclasses
import io
import threading
import time

import psycopg
from confluent_kafka import Producer

from bench.common import bench_settings, report
from bench.costs import TICK, postgres_ticks
from connectors.audit.replay import run_audit
from projections.projector import Projector
from schemas.codec import JOB_STATE
from schemas.records import JobState
from schemas.spec import JobSpec
from streams.kafka import producer_config
from streams.settings import Settings
from tests.support.isolation import create_database, drop_database, unique_name
from tests.support.kafka import produce_runs, synthetic_run
from tests.support.specs import upsert


def produce_job_states(settings: Settings, runs: range) -> int:
    """Each synthetic run's job state at its firing and at its end; the number of records."""
    producer = Producer(producer_config(settings, **{"linger.ms": 20}))
    specs: dict[str, JobSpec] = {}
    count = 0
    for r in runs:
        run = synthetic_run(r)[0]
        if run.job_id not in specs:
            specs[run.job_id] = upsert(run.job_id).spec
        spec = specs[run.job_id]
        fired = JobState(
            spec,
            False,
            False,
            1_000,
            1_000,
            run.scheduled_ms,
            run.scheduled_ms + 500_000,
            (run.run_id,),
            (),
            (),
            2 * r,
        )
        ended = dataclasses.replace(
            fired, live_runs=(), final_runs=(run.run_id,), version=2 * r + 1
        )
        for state in (fired, ended):
            producer.produce(
                settings.topic("jobs"), key=run.job_id.encode(), value=JOB_STATE.encode(state)
            )
            count += 1
        if len(producer) > 50_000:
            producer.poll(0.1)
    assert producer.flush(60) == 0
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="100,000 events")
    args = parser.parse_args()
    if args.quick:
        args.events = 100_000
    with bench_settings("projector") as settings:
        name = unique_name("bench_projector")
        url, kind = create_database(settings.database_url, name)
        try:
            runs = range(args.events // 4)
            total = produce_runs(settings, runs)
            states = produce_job_states(settings, runs)
            projector = Projector(settings.with_(database_url=url), batch_size=5000)
            thread = threading.Thread(target=projector.run, daemon=True)
            started, cpu, pg_ticks = time.monotonic(), time.process_time(), postgres_ticks()
            thread.start()
            while projector.projected < total + states and time.monotonic() - started < 600:
                time.sleep(0.05)
            elapsed = time.monotonic() - started
            cpu, pg = time.process_time() - cpu, (postgres_ticks() - pg_ticks) / TICK
            projector.stop()
            thread.join(30)
            time.sleep(1.0)  # PostgreSQL's table statistics are flushed within a second
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
                written = conn.execute(
                    "SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relname = 'jobs'"
                ).fetchone()
            audit_started = time.monotonic()
            run_audit(settings, None, None, None, io.StringIO())  # its verdict is not the point
            audit_s = time.monotonic() - audit_started
            report(
                "projector",
                {
                    "events": total,
                    "job_states": states,
                    "projected_rows": row[0] if row else 0,
                    "job_rows_written": written[0] if written else 0,
                    "seconds": elapsed,
                    "records_per_s": (total + states) / elapsed,
                    "projector_cpu_ms_per_run": cpu * 1000 / len(runs),
                    "postgres_cpu_ms_per_run": pg * 1000 / len(runs),
                    "audit_replay_s": audit_s,
                    "audit_events_per_s": total / audit_s,
                },
            )
        finally:
            drop_database(settings.database_url, name, kind)


if __name__ == "__main__":
    main()
