"""Bounded history: the retention policy of the projection tables.

The projection grows with every run (four transitions and a few log chunks each), so old
history is pruned, by the projector in the background (:class:`Pruner`) and on demand by
``cronlog db prune`` (:func:`prune`). The rules, all of them applied together:

- A run is removed, with its transitions and its log chunks, when it is final
  (succeeded, failed, cancelled, skipped), both scheduled and finished more than
  ``CRONLOG_RETENTION_DAYS`` ago (default 90; 0 turns retention off), and its job has at
  least ``CRONLOG_RETENTION_KEEP_RUNS`` (default 100) runs scheduled later. So the newest
  N runs of every job stay whatever their age, a run that is not final (a stuck
  ``running`` run is something to look at, not to forget) is never removed, and a
  backfill of old dates stays for the retention period after it finished.
- Log chunks older than ``CRONLOG_RETENTION_LOG_DAYS`` (default 7, the run-logs topic's
  ``retention.ms``) are removed whatever their run: a rebuild replays the topics and can
  only restore the chunks the run-logs topic still holds, so the table keeps no more than
  that and a rebuild gives back what the live table had. 0 keeps logs as long as runs.

Why a rebuild (``cronlog projector --rebuild``) gives the same rows: it replays run-events
(kept for ever) and run-logs (kept 7 days), then applies this policy to the rebuilt
tables before the swap. Pruning is composable: a run that a prune removes has N runs of
its job scheduled strictly later, the N newest runs are never removed, and adding runs
only raises the N-th newest time, so pruning at t1, adding runs, and pruning at t2 >= t1
removes exactly what one prune at t2 of everything would (:func:`pruned` is the
executable statement of the rule; tests/unit/test_retention.py checks this property).
The exception is a run that gets new events after it was pruned (a rerun of a 90-day-old
run): its row comes back holding only the new transitions, where a rebuild would hold all.

Why batched deletes and not time partitions: partitions can only be dropped whole, and
"keep the newest N runs of each job" and "never a run that is not final" cut across any
time partitioning; every table's keys (run_id, event_id) would also need the partition
column, and the projector's upserts would change. Deletes in small transactions cost
time per row instead of O(1): at the rate bench/prune.py measures (docs/operations.md,
"Bounded history") a day of a million runs (some 6,000,000 rows) prunes in minutes; at
tens of millions of runs a day the pruning would take hours of a backend a day, and
partitions (with the runs to keep moved out before a drop) would start to pay.

How it stays out of the projector's way: every batch is its own short transaction of at
most ``batch`` runs, takes its victims with ``FOR UPDATE SKIP LOCKED`` (so it never waits
for a row the projector holds, and the projector waits at most for one batch when it
touches a run being removed, which a run 90 days old practically never sees), and the
background pruner sleeps between batches so it uses at most a share of the database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from schemas.records import FINAL_STATES

log = logging.getLogger("cronlog.retention")

DEFAULT_DAYS = 90.0
DEFAULT_KEEP_RUNS = 100
# The run-logs topic's retention.ms (streams/topics.py): what a rebuild can restore.
DEFAULT_LOG_DAYS = 7.0
DEFAULT_INTERVAL_S = 600.0


class RetentionError(ValueError):
    """A retention setting is malformed. Not retryable: fix the environment."""


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    days: float = DEFAULT_DAYS  # 0: keep runs for ever
    keep_runs: int = DEFAULT_KEEP_RUNS
    log_days: float = DEFAULT_LOG_DAYS  # 0: log chunks go with their runs only
    batch: int = 1000  # runs (or log chunks) per transaction
    interval_s: float = DEFAULT_INTERVAL_S  # the projector's pruner: pause between rounds
    # The projector's pruner sleeps so that it works at most this share of the time.
    duty: float = 0.5

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RetentionPolicy:
        """The policy the CRONLOG_RETENTION_* variables of `env` describe; the entry point
        (connectors/cli/common.py) passes its environment in."""

        def number(name: str, default: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            try:
                value = float(raw)
            except ValueError:
                raise RetentionError(f"{name} must be a number, got {raw!r}") from None
            if not value >= 0:  # also refuses NaN
                raise RetentionError(f"{name} must be 0 or more, got {raw!r}")
            return value

        keep = number("CRONLOG_RETENTION_KEEP_RUNS", DEFAULT_KEEP_RUNS)
        if keep != int(keep):
            raise RetentionError(f"CRONLOG_RETENTION_KEEP_RUNS must be a whole number, not {keep}")
        return cls(
            days=number("CRONLOG_RETENTION_DAYS", DEFAULT_DAYS),
            keep_runs=int(keep),
            log_days=number("CRONLOG_RETENTION_LOG_DAYS", DEFAULT_LOG_DAYS),
            interval_s=number("CRONLOG_RETENTION_INTERVAL_S", DEFAULT_INTERVAL_S) or 1.0,
        )

    @property
    def enabled(self) -> bool:
        return self.days > 0 or self.log_days > 0

    def run_cutoff(self, now: datetime) -> datetime | None:
        return now - timedelta(days=self.days) if self.days > 0 else None

    def log_cutoff(self, now: datetime) -> datetime | None:
        return now - timedelta(days=self.log_days) if self.log_days > 0 else None

    def describe(self, now: datetime) -> str:
        runs = self.run_cutoff(now)
        logs = self.log_cutoff(now)
        parts = [
            "runs: kept for ever"
            if runs is None
            else f"runs: final ones scheduled and finished before {runs:%Y-%m-%d %H:%M} UTC"
            f" ({self.days:g} days), keeping the newest {self.keep_runs} of every job"
        ]
        if logs is not None:
            parts.append(f"log chunks: before {logs:%Y-%m-%d %H:%M} UTC ({self.log_days:g} days)")
        return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class RunRow:
    """What the rule looks at in a run's row."""

    run_id: str
    job_id: str
    scheduled_at: datetime
    state: str
    finished_at: datetime | None


def pruned(runs: Iterable[RunRow], policy: RetentionPolicy, now: datetime) -> set[str]:
    """The run ids the policy removes from this set of runs: the rule, in plain Python
    (the SQL below must remove exactly these)."""
    cutoff = policy.run_cutoff(now)
    if cutoff is None:
        return set()
    by_job: dict[str, list[RunRow]] = {}
    for run in runs:
        by_job.setdefault(run.job_id, []).append(run)
    gone: set[str] = set()
    for rows in by_job.values():
        times = sorted((r.scheduled_at for r in rows), reverse=True)
        if policy.keep_runs > 0 and len(times) < policy.keep_runs:
            continue
        # Below the N-th newest scheduled time: N runs are scheduled strictly later.
        bound = min(cutoff, times[policy.keep_runs - 1]) if policy.keep_runs > 0 else cutoff
        gone.update(
            r.run_id
            for r in rows
            if r.state in FINAL_STATES
            and r.scheduled_at < bound
            and r.finished_at is not None
            and r.finished_at < cutoff
        )
    return gone


@dataclass(slots=True)
class PruneResult:
    runs: int = 0
    transitions: int = 0
    logs: int = 0  # log chunks: with their runs, and aged out
    batches: int = 0
    seconds: float = 0.0
    complete: bool = True  # False: stopped (or out of time) before the end

    @property
    def rows(self) -> int:
        return self.runs + self.transitions + self.logs

    def add(self, other: PruneResult) -> None:
        self.runs += other.runs
        self.transitions += other.transitions
        self.logs += other.logs
        self.batches += other.batches


_FINAL = tuple(sorted(FINAL_STATES))
# Distinct job ids from the (job_id, scheduled_at) index, a chunk at a time: one index
# probe per job (a "loose index scan"), not a scan of every run.
JOBS = """
WITH RECURSIVE j(job_id) AS (
    (SELECT job_id FROM runs WHERE job_id > %(after)s ORDER BY job_id LIMIT 1)
    UNION ALL
    SELECT (SELECT r.job_id FROM runs r WHERE r.job_id > j.job_id ORDER BY r.job_id LIMIT 1)
    FROM j WHERE j.job_id IS NOT NULL
)
SELECT job_id FROM j WHERE job_id IS NOT NULL LIMIT %(limit)s"""
# Per job, the scheduled time below which its runs may go: the N-th newest one (jobs with
# fewer than N runs have none and keep everything). It only rises as runs arrive, so a
# bound computed once stays safe while the chunk is pruned.
BOUNDS = """
SELECT k.job_id, LEAST(%(cutoff)s, t.scheduled_at)
FROM unnest(%(jobs)s::text[]) AS k(job_id)
CROSS JOIN LATERAL (
    SELECT r.scheduled_at FROM runs r WHERE r.job_id = k.job_id
    ORDER BY r.scheduled_at DESC OFFSET %(skip)s LIMIT 1
) t"""
# One batch: lock up to `batch` victims (skipping rows the projector holds), then remove
# their transitions, log chunks and rows in the same transaction. Oldest first, by an
# index scan that stops at `batch` rows (see `prune`).
DELETE_RUNS = """
WITH victims AS (
    SELECT v.run_id
    FROM unnest(%(jobs)s::text[], %(bounds)s::timestamptz[]) AS k(job_id, bound)
    CROSS JOIN LATERAL (
        SELECT r.run_id FROM runs r
        WHERE r.job_id = k.job_id AND r.scheduled_at < k.bound
          AND r.state = ANY(%(final)s) AND r.finished_at < %(cutoff)s
        ORDER BY r.scheduled_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    ) v
    LIMIT %(batch)s
), gone_transitions AS (
    DELETE FROM run_transitions t USING victims v WHERE t.run_id = v.run_id RETURNING 1
), gone_logs AS (
    DELETE FROM run_logs l USING victims v WHERE l.run_id = v.run_id RETURNING 1
), gone_runs AS (
    DELETE FROM runs r USING victims v WHERE r.run_id = v.run_id RETURNING 1
)
SELECT (SELECT count(*) FROM gone_runs), (SELECT count(*) FROM gone_transitions),
       (SELECT count(*) FROM gone_logs)"""
DELETE_OLD_LOGS = """
DELETE FROM run_logs WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM run_logs WHERE at < %(cutoff)s LIMIT %(batch)s FOR UPDATE SKIP LOCKED
))"""
JOB_CHUNK = 500


class _Pace:
    """Stop, out-of-time and duty-cycle checks between batches."""

    def __init__(self, stop: threading.Event | None, budget_s: float | None, duty: float):
        self.stop = stop or threading.Event()
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.duty = duty

    def go_on(self, batch_started: float | None = None) -> bool:
        if batch_started is not None and self.duty < 1.0:
            busy = time.monotonic() - batch_started
            self.stop.wait(busy * (1.0 / max(self.duty, 0.01) - 1.0))
        if self.stop.is_set():
            return False
        return self.deadline is None or time.monotonic() < self.deadline


def prune(
    conn: psycopg.Connection[Any],
    policy: RetentionPolicy,
    *,
    now: datetime | None = None,
    stop: threading.Event | None = None,
    budget_s: float | None = None,
    duty: float = 1.0,
) -> PruneResult:
    """Apply the policy on an autocommit connection, batch by batch (each batch its own
    transaction, so an interrupted prune leaves consistent tables and the next one goes
    on). Stops early, with ``complete`` False, when `stop` is set or after `budget_s`."""
    if not conn.autocommit:
        raise ValueError("prune needs an autocommit connection: one transaction per batch")
    started = time.monotonic()
    now = now or datetime.now(UTC)
    pace = _Pace(stop, budget_s, duty)
    result = PruneResult()
    # The victims must come from an index scan that stops after `batch` rows: with its
    # generic per-job estimate the planner may pick a bitmap scan, which reads every
    # older run of the job for each batch (quadratic on a job with a long history).
    conn.execute("SET enable_bitmapscan = off")
    try:
        complete = _prune_runs(conn, policy, now, pace, result)
        complete = complete and _prune_logs(conn, policy, now, pace, result)
    finally:
        conn.execute("RESET enable_bitmapscan")
    result.complete = complete
    result.seconds = time.monotonic() - started
    return result


def _prune_runs(
    conn: psycopg.Connection[Any],
    policy: RetentionPolicy,
    now: datetime,
    pace: _Pace,
    result: PruneResult,
) -> bool:
    cutoff = policy.run_cutoff(now)
    if cutoff is None:
        return True
    after = ""
    while pace.go_on():
        jobs = [r[0] for r in conn.execute(JOBS, {"after": after, "limit": JOB_CHUNK})]
        if not jobs:
            return True
        after = jobs[-1]
        if policy.keep_runs > 0:
            args = {"cutoff": cutoff, "jobs": jobs, "skip": policy.keep_runs - 1}
            bounded = conn.execute(BOUNDS, args).fetchall()
        else:
            bounded = [(job, cutoff) for job in jobs]
        if not bounded:
            continue
        args = {
            "jobs": [job for job, _ in bounded],
            "bounds": [bound for _, bound in bounded],
            "final": list(_FINAL),
            "cutoff": cutoff,
            "batch": policy.batch,
        }
        while True:
            batch_started = time.monotonic()
            row = conn.execute(DELETE_RUNS, args).fetchone()
            runs, transitions, logs = row if row else (0, 0, 0)
            result.add(PruneResult(runs, transitions, logs, batches=1))
            if runs and not pace.go_on(batch_started):
                return False
            if runs < policy.batch:
                break  # this chunk of jobs is done (rows held by the projector: next round)
    return False


def _prune_logs(
    conn: psycopg.Connection[Any],
    policy: RetentionPolicy,
    now: datetime,
    pace: _Pace,
    result: PruneResult,
) -> bool:
    cutoff = policy.log_cutoff(now)
    if cutoff is None:
        return True
    batch = policy.batch * 5  # chunks are smaller than runs with their transitions
    while pace.go_on():
        batch_started = time.monotonic()
        removed = conn.execute(DELETE_OLD_LOGS, {"cutoff": cutoff, "batch": batch}).rowcount
        result.add(PruneResult(logs=max(removed, 0), batches=1))
        if removed < batch:
            return True
        if not pace.go_on(batch_started):
            return False
    return False


class Pruner:
    """The projector's background retention: a thread with its own connection that
    prunes every ``interval_s``, pacing its batches, and never stops the projector (a
    failing round is logged and retried next round)."""

    def __init__(self, conninfo: str, policy: RetentionPolicy):
        self.conninfo = conninfo
        self.policy = policy
        self.rounds = 0
        self.total = PruneResult()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cronlog-pruner", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    done = prune(conn, self.policy, stop=self._stop, duty=self.policy.duty)
                self.total.add(done)
                self.rounds += 1
                if done.rows:
                    log.info(
                        "retention removed %d runs, %d transitions, %d log chunks in %.1f s",
                        done.runs,
                        done.transitions,
                        done.logs,
                        done.seconds,
                    )
            except psycopg.Error as exc:
                log.warning("retention round failed (%s); retrying next round", exc)
            self._stop.wait(self.policy.interval_s)
