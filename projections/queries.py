"""The read side of the projections: every query the API, the dashboard and the CLI run
against PostgreSQL, as (sql, params) pairs. Nothing here connects or decides who may see
what: callers pass the owner scope in (`owner` None: an admin, everything).

The tables are projections/migrations' (jobs, runs, run_transitions, run_logs,
run_lateness, workers, projector_offsets); a column list is written once, here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

Query = tuple[str, tuple[Any, ...]]

JOB_COLUMNS = "job_id, owner, spec, paused, deleted, next_due_at, created_at, updated_at, cycle"
RUN_COLUMNS = (
    "r.run_id, r.job_id, r.scheduled_at, r.trigger, r.state, r.attempt, r.worker_id,"
    " r.created_at, r.started_at, r.finished_at, r.exit_code, r.error, r.updated_at,"
    " r.params"
)
LOG_COLUMNS = "attempt, stream, seq, data, at"


def _where(clauses: list[tuple[str, Any]]) -> tuple[str, tuple[Any, ...]]:
    """`clauses` with a None value left out, joined by AND (TRUE when none is left)."""
    kept = [(sql, value) for sql, value in clauses if value is not None]
    return " AND ".join(sql for sql, _ in kept) or "TRUE", tuple(v for _, v in kept)


# -- jobs ------------------------------------------------------------------------------------
def job(job_id: str) -> Query:
    """One job, deleted or not."""
    return f"SELECT {JOB_COLUMNS} FROM jobs WHERE job_id = %s", (job_id,)


def jobs_page(
    scope: str | None, owner: str | None, paused: bool | None, after: str | None, limit: int
) -> Query:
    """Live jobs by id after `after`, one more than `limit` (so the caller knows whether
    there is a next page). `scope`: the caller's owner, None for an admin."""
    where, params = _where(
        [
            ("owner = %s", scope),
            ("owner = %s", owner),
            ("paused = %s", paused),
            ("job_id > %s", after),
        ]
    )
    return (
        f"SELECT {JOB_COLUMNS} FROM jobs WHERE NOT deleted AND {where} ORDER BY job_id LIMIT %s",
        (*params, limit + 1),
    )


def foreign_jobs(job_ids: list[str], owner: str) -> Query:
    """Those of `job_ids` registered by an owner other than `owner`."""
    return (
        "SELECT job_id FROM jobs WHERE job_id = ANY(%s) AND owner NOT IN (%s, '') ORDER BY job_id",
        (job_ids, owner),
    )


def dependency_graph(owner: str) -> Query:
    """Every registered job of `owner` with its upstreams (the graph a change joins)."""
    return (
        "SELECT job_id, spec->'depends_on' AS depends_on FROM jobs"
        " WHERE owner = %s AND NOT deleted",
        (owner,),
    )


def owned_jobs(job_ids: list[str], owner: str) -> Query:
    """Those of `job_ids` registered by `owner`."""
    return "SELECT job_id FROM jobs WHERE job_id = ANY(%s) AND owner = %s", (job_ids, owner)


def _visible(scope: str | None) -> tuple[str, tuple[Any, ...]]:
    if scope is None:
        return "NOT deleted", ()
    return "NOT deleted AND owner = %s", (scope,)


def dependents(scope: str | None, limit: int) -> Query:
    """The visible jobs that depend on others, with their upstreams (`ups`)."""
    where, params = _visible(scope)
    return (
        f"SELECT job_id, spec->'depends_on' AS ups FROM jobs WHERE {where}"
        " AND jsonb_array_length(spec->'depends_on') > 0 ORDER BY job_id LIMIT %s",
        (*params, limit),
    )


def visible_among(scope: str | None, job_ids: list[str]) -> Query:
    """Those of `job_ids` that are live and visible."""
    where, params = _visible(scope)
    return f"SELECT job_id FROM jobs WHERE {where} AND job_id = ANY(%s)", (*params, job_ids)


def downstream(scope: str | None, job_id: str) -> Query:
    """The visible jobs that name `job_id` as an upstream."""
    where, params = _visible(scope)
    return (
        f"SELECT job_id FROM jobs WHERE {where} AND spec->'depends_on' ? %s ORDER BY job_id",
        (*params, job_id),
    )


# -- runs ------------------------------------------------------------------------------------
def runs_page(
    scope: str | None,
    job_id: str | None,
    state: str | None,
    since: datetime | None,
    until: datetime | None,
    before: tuple[str, str] | None,
    limit: int,
) -> Query:
    """Runs newest first by scheduled time (`since` inclusive, `until` exclusive), those
    strictly before the `before` (scheduled_at ISO text, run_id) cursor, one more than
    `limit`."""
    where, params = _where(
        [
            ("j.owner = %s", scope),
            ("r.job_id = %s", job_id),
            ("r.state = %s", state),
            ("r.scheduled_at >= %s", since),
            ("r.scheduled_at < %s", until),
        ]
    )
    if before is not None:
        where += " AND (r.scheduled_at, r.run_id) < (%s::timestamptz, %s)"
        params = (*params, *before)
    return (
        f"SELECT {RUN_COLUMNS} FROM runs r JOIN jobs j ON j.job_id = r.job_id"
        f" WHERE {where} ORDER BY r.scheduled_at DESC, r.run_id DESC LIMIT %s",
        (*params, limit + 1),
    )


def run(run_id: str) -> Query:
    """One run with its job's owner."""
    return (
        f"SELECT {RUN_COLUMNS}, j.owner FROM runs r JOIN jobs j ON j.job_id = r.job_id"
        " WHERE r.run_id = %s",
        (run_id,),
    )


def transitions(run_id: str) -> Query:
    return (
        "SELECT attempt, state, at, worker_id, detail FROM run_transitions"
        " WHERE run_id = %s ORDER BY seq, at",
        (run_id,),
    )


# A chunk is shown only if its writer held the attempt (any worker principal may write
# to run-logs); chunks from before writers were recorded ('') are shown as they are.
HELD = (
    "(run_logs.worker_id = '' OR EXISTS (SELECT 1 FROM run_transitions h"
    " WHERE h.run_id = run_logs.run_id AND h.attempt = run_logs.attempt"
    " AND h.worker_id = run_logs.worker_id))"
)


def log_tail(run_id: str, chunks: int) -> Query:
    """The run's last `chunks` log chunks, oldest first."""
    return (
        f"SELECT * FROM (SELECT {LOG_COLUMNS} FROM run_logs"
        f" WHERE run_id = %s AND {HELD} ORDER BY at DESC, seq DESC LIMIT %s) t"
        " ORDER BY at, seq",
        (run_id, chunks),
    )


def logs(run_id: str, attempt: int | None, stream: str | None, limit: int) -> Query:
    """The run's first `limit` log chunks in order."""
    where, params = _where(
        [("run_id = %s", run_id), ("attempt = %s", attempt), ("stream = %s", stream)]
    )
    return (
        f"SELECT {LOG_COLUMNS} FROM run_logs WHERE {where} AND {HELD}"
        " ORDER BY attempt, at, stream, seq LIMIT %s",
        (*params, limit),
    )


def recent_states(job_ids: list[str], per_job: int) -> Query:
    """The newest `per_job` runs of each job, oldest first: job_id, run_id, state."""
    return (
        "SELECT x.job_id, r.run_id, r.state, r.scheduled_at FROM unnest(%s::text[]) x(job_id)"
        " CROSS JOIN LATERAL (SELECT run_id, state, scheduled_at FROM runs"
        "  WHERE runs.job_id = x.job_id ORDER BY scheduled_at DESC, run_id DESC LIMIT %s) r"
        " ORDER BY x.job_id, r.scheduled_at, r.run_id",
        (job_ids, per_job),
    )


def lateness(job_id: str, limit: int) -> Query:
    """Start lateness (s) of the job's newest `limit` scheduled runs that started."""
    return (
        "SELECT lateness_s FROM run_lateness WHERE job_id = %s ORDER BY scheduled_at DESC LIMIT %s",
        (job_id, limit),
    )


# -- workers, health -------------------------------------------------------------------------
def workers() -> Query:
    return (
        "SELECT worker_id, capacity, free, labels, last_heartbeat_at, state"
        " FROM workers ORDER BY worker_id",
        (),
    )


def projector_alive() -> Query:
    """Answers once the projections' schema exists (readiness)."""
    return "SELECT 1 FROM projector_offsets LIMIT 1", ()


# -- owner quotas (connectors/api/quotas.py) ---------------------------------------------------
def owner_usage(owner: str, job_id: str = "") -> Query:
    """What an owner holds against its quotas: jobs registered, runs not final (in
    flight), backfill runs created and not final, the runs its queued backfills have
    still to create (the jobs rows' estimate), and its jobs other than `job_id` with a
    backfill pending (queued, or a backfill run not final)."""
    live = "('waiting', 'due', 'dispatched', 'running', 'retrying')"
    return (
        "SELECT"
        " (SELECT count(*) FROM jobs WHERE owner = %s AND NOT deleted) AS jobs,"
        " (SELECT coalesce(sum(backfill_pending), 0) FROM jobs WHERE owner = %s"
        "   AND NOT deleted) AS backfill_queued,"
        " (SELECT count(*) FROM runs r JOIN jobs j ON j.job_id = r.job_id"
        f"   WHERE j.owner = %s AND r.state IN {live}) AS in_flight,"
        " (SELECT count(*) FROM runs r JOIN jobs j ON j.job_id = r.job_id"
        f"   WHERE j.owner = %s AND r.trigger = 'backfill' AND r.state IN {live})"
        "   AS backfill_live,"
        " (SELECT count(*) FROM jobs j WHERE j.owner = %s AND NOT j.deleted"
        "   AND j.job_id <> %s AND (j.backfill_pending > 0 OR EXISTS (SELECT 1 FROM runs r"
        f"   WHERE r.job_id = j.job_id AND r.trigger = 'backfill' AND r.state IN {live})))"
        "   AS backfill_jobs",
        (owner, owner, owner, owner, owner, job_id),
    )
