"""Retention at scale: a projection of N transitions (N/4 runs over 180 days, generated in
PostgreSQL), then a prune with the default policy (90 days, the newest 100 runs of every
job, log chunks 7 days), while a projector works through a backlog of run-events.

Figures: the prune's time and rows removed per second, and the projector's throughput
on the same database without a prune running and during the prune.
`python -m bench.prune --transitions 10000000` (`--quick`: 1,000,000)."""

from __future__ import annotations

import argparse
import threading
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from bench.common import bench_settings, report
from projections.migrate import migrate_for
from projections.projector import Projector
from projections.retention import PruneResult, RetentionPolicy, prune
from streams.settings import Settings
from tests.support.isolation import create_database, drop_database, unique_name
from tests.support.kafka import produce_runs

DAYS = 180
HOT_JOBS = 5  # a fifth of the runs: 100,000 runs each at the full size
RARE_JOBS = 100  # jobs with few runs (30 each): keep-last-N protects all of theirs
RARE_RUNS = 30

# Runs of the frequent jobs evenly over 180 days, up to now (a fifth of them from 5 hot
# jobs with a run every few minutes, the rest a run every few hours); 95 % succeeded, 4 % failed,
# 1 % cancelled, and one in a thousand stuck in `running` (never to be pruned). Every
# fourth run has a log chunk. Then 100 jobs with 30 runs each over the same period.
FILL = """
INSERT INTO runs (run_id, job_id, scheduled_at, trigger, state, attempt, worker_id,
                  created_at, started_at, finished_at, exit_code, error, updated_at, seq)
SELECT job || '@' || (extract(epoch FROM at) * 1000)::bigint, job, at, 'schedule', state, 1,
       'w1', at - interval '1 s', at + interval '1 s',
       CASE WHEN state = 'running' THEN NULL ELSE at + interval '5 s' END,
       CASE state WHEN 'succeeded' THEN 0 WHEN 'failed' THEN 1 END, NULL,
       at + interval '5 s', CASE WHEN state = 'running' THEN 3 ELSE 4 END
FROM (
    SELECT CASE WHEN i %% 5 = 0 THEN 'hot-' || (i / 5 %% %(hot)s)
                ELSE 'bench-' || (i %% %(jobs)s) END AS job,
           %(now)s - make_interval(secs => (%(runs)s - i)::double precision * %(step)s) AS at,
           CASE WHEN i %% 1000 = 7 THEN 'running' WHEN i %% 100 = 1 THEN 'cancelled'
                WHEN i %% 25 = 2 THEN 'failed' ELSE 'succeeded' END AS state
    FROM generate_series(1, %(runs)s) AS i
    UNION ALL
    SELECT 'rare-' || (i %% %(rare)s),
           %(now)s - make_interval(days => (i / %(rare)s) * 6 %% 180, secs => i),
           'succeeded'
    FROM generate_series(0, %(rare)s * %(rare_runs)s - 1) AS i
) AS g(job, at, state)"""
FILL_TRANSITIONS = """
INSERT INTO run_transitions (event_id, run_id, attempt, state, at, worker_id, detail, seq)
SELECT r.run_id || '#' || s.seq, r.run_id, 1, s.state,
       r.scheduled_at + make_interval(secs => s.seq), 'w1',
       jsonb_build_object('reason', '', 'exit_code', r.exit_code, 'trigger', 'schedule'), s.seq
FROM runs r
CROSS JOIN LATERAL (VALUES (1, 'due'), (2, 'dispatched'), (3, 'running'), (4, r.state))
    AS s(seq, state)
WHERE s.seq <= r.seq"""
FILL_LOGS = """
INSERT INTO run_logs (run_id, attempt, seq, stream, data, at)
SELECT run_id, 1, 0, 'stdout', 'processed 1234 records in 0.8 s; checksum 9f2c7a41e0', started_at
FROM runs WHERE hashtext(run_id) % 4 = 0"""


def fill(url: str, transitions: int) -> dict[str, Any]:
    runs = transitions // 4
    frequent = runs - RARE_JOBS * RARE_RUNS
    jobs = max(1, frequent * 4 // 5 // 1300)  # about a run every 3.3 hours over 180 days
    args = {
        "now": datetime.now(UTC),
        "runs": frequent,
        "jobs": jobs,
        "step": DAYS * 86400 / frequent,
        "hot": HOT_JOBS,
        "rare": RARE_JOBS,
        "rare_runs": RARE_RUNS,
    }
    started = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(FILL, args)
        conn.execute(FILL_TRANSITIONS)
        conn.execute(FILL_LOGS)
        conn.execute("VACUUM ANALYZE runs, run_transitions, run_logs")
        counts = _counts(conn)
    jobs_total = jobs + HOT_JOBS + RARE_JOBS
    return {**counts, "jobs": jobs_total, "fill_s": time.monotonic() - started}


def _counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for table in ("runs", "run_transitions", "run_logs"):
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        ).fetchone()
        out[table] = int(row[0]) if row else 0
    size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    out["database_mb"] = int(size[0]) // 2**20 if size else 0
    return out


def project(settings: Settings, runs: range) -> tuple[int, float]:
    """Produce these synthetic runs' events, then time a projector through them."""
    total = produce_runs(settings, runs)
    projector = Projector(settings, batch_size=5000)
    thread = threading.Thread(target=projector.run, daemon=True)
    started = time.monotonic()
    thread.start()
    while projector.projected < total and time.monotonic() - started < 900:
        time.sleep(0.1)
    elapsed = time.monotonic() - started
    projector.stop()
    thread.join(60)
    return total, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transitions", type=int, default=10_000_000)
    parser.add_argument("--events", type=int, default=200_000, help="projected per phase")
    parser.add_argument("--duty", type=float, default=1.0, help="the prune's share of time")
    parser.add_argument("--quick", action="store_true", help="1,000,000 transitions")
    args = parser.parse_args()
    if args.quick:
        args.transitions, args.events = 1_000_000, 50_000
    with bench_settings("prune") as settings:
        name = unique_name("bench_prune")
        url, kind = create_database(settings.database_url, name)
        try:
            mine = settings.with_(database_url=url)
            migrate_for(mine)
            filled = fill(url, args.transitions)
            print(f"filled: {filled}", flush=True)
            # The projector's events are synthetic runs of 2027: the policy keeps them.
            base_events, base_s = project(mine, range(0, args.events // 4))

            outcome: list[PruneResult] = []

            def pruning() -> None:
                with psycopg.connect(url, autocommit=True) as conn:
                    outcome.append(prune(conn, RetentionPolicy(), duty=args.duty))

            pruner = threading.Thread(target=pruning)
            produced_during = args.events // 4
            pruner.start()
            time.sleep(2)  # well into the prune's batches
            during_events, during_s = project(
                mine, range(produced_during, produced_during + args.events // 4)
            )
            overlapped = pruner.is_alive()
            pruner.join()
            done = outcome[0]
            with psycopg.connect(url) as conn:
                after = _counts(conn)
            report(
                "prune",
                {
                    **{f"before_{k}": v for k, v in filled.items()},
                    "prune_s": done.seconds,
                    "removed_runs": done.runs,
                    "removed_transitions": done.transitions,
                    "removed_log_chunks": done.logs,
                    "removed_rows_per_s": done.rows / done.seconds if done.seconds else 0.0,
                    "batches": done.batches,
                    "prune_duty": args.duty,
                    **{f"after_{k}": v for k, v in after.items()},
                    "projector_events": base_events,
                    "projector_events_per_s_alone": base_events / base_s,
                    "projector_events_per_s_during_prune": during_events / during_s,
                    "projection_entirely_during_prune": overlapped,
                },
            )
        finally:
            _drop(settings.database_url, name, kind)


def _drop(admin_url: str, name: str, kind: str) -> None:
    """DROP ... WITH (FORCE) refuses to end an autovacuum worker (run as the superuser),
    which the mass delete is likely to have started; a plain DROP DATABASE ends it."""
    try:
        drop_database(admin_url, name, kind)
    except psycopg.errors.InsufficientPrivilege:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


if __name__ == "__main__":
    main()
