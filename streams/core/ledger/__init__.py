"""The ledger: a deterministic state machine over one job's log.

docs/architecture.md, "The ledger", has the rules in prose.

`decide(job, runs, input, config)` returns what the input changes: the new job state,
changed runs, run-events, dispatch requests and the runs to forget. It is pure: time
comes from `input.at_ms`, ids are derived from the log, and nothing here knows Kafka.
The process in streams/ledger.py feeds it from `job-log` inside Kafka
transactions and writes the decision back atomically.

The rules, in short:
- one run per (job, scheduled time): a fire proposal at or below the job's `fired_ms`
  watermark, or whose run exists, changes nothing;
- proposals that arrive late (a takeover after a crash) follow the job's misfire policy
  inside a bounded catch-up window;
- a run moves forward only: stale attempts, claims by another worker, reports for a
  state the run has left, and premature deadlines are rejected with a reason;
- the one step back: an attempt claimed but never started (released by its worker, or
  its worker declared dead before the attempt's start time) is dispatched again, same attempt.
"""

from __future__ import annotations

from schemas.records import (
    BackfillRequested,
    CancelRequested,
    ClaimRequested,
    DeadlineReached,
    DependencyLinked,
    DispatchFailed,
    FireProposed,
    JobDeleted,
    JobEvent,
    JobPaused,
    JobResumed,
    JobState,
    JobUpserted,
    LedgerInput,
    RerunRequested,
    RunFinished,
    RunNowRequested,
    RunReleased,
    RunStarted,
    UpstreamFinished,
    WorkerLost,
)
from schemas.spec import AtSchedule, JobSpec
from streams.core.clock import PROBE_JOB_ID
from streams.core.ledger.attempts import Attempts
from streams.core.ledger.decision import (
    MAY_HAVE_STARTED,
    STARTED,
    WITHDRAWN,
    WITHDRAWN_BY_CHANGE,
    WITHDRAWN_BY_DELETE,
    WITHDRAWN_BY_PAUSE,
    Decision,
    LedgerConfig,
    RunLookup,
)
from streams.core.ledger.dependencies import Dependencies
from streams.core.ledger.firing import Firing
from streams.core.ledger.kernel import dependency_links, due_after
from streams.core.secret_grants import refusal

__all__ = [
    "MAY_HAVE_STARTED",
    "STARTED",
    "WITHDRAWN",
    "WITHDRAWN_BY_CHANGE",
    "WITHDRAWN_BY_DELETE",
    "WITHDRAWN_BY_PAUSE",
    "Decision",
    "LedgerConfig",
    "RunLookup",
    "decide",
    "input_job",
]


class _Builder(Firing, Dependencies, Attempts):
    """One decision, built by the concern each input belongs to (on one shared kernel)."""


def decide(
    job: JobState | None,
    runs: RunLookup,
    inp: LedgerInput,
    config: LedgerConfig = LedgerConfig(),
    now_ms: int | None = None,
) -> Decision:
    """`now_ms` is the ledger's one clock: the broker's append time of the input's
    job-log record (LogAppendTime), which no producer can skew. Without it (pure tests,
    the simulation) the input's own `at_ms` stands in."""
    now = inp.at_ms if now_ms is None else now_ms
    if isinstance(inp, FireProposed) and inp.job_id == PROBE_JOB_ID:
        return Decision()  # a scheduler's clock probe: only its broker stamp mattered
    if isinstance(inp, JobUpserted) and job is not None and _owned_by_another(job, inp.spec):
        # Checked here, where the decision is made, not only by the API against its
        # projection (which may lag): a job id belongs to the owner that registered it,
        # deleted or not, so no one else takes over its runs, logs or dependents.
        return Decision(
            rejected=f"job {inp.spec.job_id!r} belongs to owner {job.spec.owner!r}; "
            f"owner {inp.spec.owner!r} cannot register or replace it (ids are never "
            "passed on, even after a delete: use another job id)",
            dead_letter=True,
        )
    if isinstance(inp, JobUpserted) and (refused := _refused_secret(inp.spec, config)):
        # A secret is an owner's: a spec naming one its owner may not use is refused
        # here (the API answers 422 first; the worker, which holds the values, refuses
        # again when it resolves them, should a grant be revoked later).
        return Decision(rejected=refused, dead_letter=True)
    if isinstance(inp, JobUpserted) and (job is None or job.deleted):
        return _register(job, inp, now, _effective(inp.at_ms, now, config))
    if job is None and isinstance(inp, DependencyLinked):
        if inp.trail:
            return Decision()  # a cycle probe: a job not registered passes nothing on
        job = _stub(inp.job_id, now)  # the upstream is not registered (yet)
    if job is None:
        return Decision(rejected=f"unknown job {input_job(inp)}")
    builder = _Builder(job, runs, now, config)
    match inp:
        case JobUpserted():
            builder.respec(inp, _effective(inp.at_ms, now, config))
        case JobPaused() | JobResumed() | JobDeleted():
            builder.job_flag(inp, _effective(inp.at_ms, now, config))
        case FireProposed():
            builder.fire(inp)
        case RunNowRequested():
            builder.run_now(inp)
        case RerunRequested():
            builder.rerun(inp)
        case CancelRequested():
            builder.cancel(inp)
        case ClaimRequested():
            builder.claim(inp)
        case RunStarted():
            builder.started(inp)
        case RunFinished():
            builder.finished(inp)
        case DeadlineReached():
            builder.deadline(inp)
        case WorkerLost():
            builder.lost(inp)
        case RunReleased():
            builder.released(inp)
        case BackfillRequested():
            builder.backfill(inp)
        case DependencyLinked():
            builder.link(inp)
        case UpstreamFinished():
            builder.upstream_finished(inp)
        case DispatchFailed():
            builder.dispatch_failed(inp)
    if (
        builder.job.backfill_queue
        and not isinstance(inp, BackfillRequested)
        and (builder.job.deleted or any(r.final for r in builder.runs.values()))
    ):
        # A run of the job ended (or the job was deleted): its queued backfills go on
        # (streams/core/ledger/firing.py, `Firing.pace_backfills`).
        builder.pace_backfills()
    return builder.decision()


def _stub(job_id: str, at: int) -> JobState:
    """A placeholder for a job others depend on before it exists: deleted, so it never
    fires, but it keeps the links until the job is registered."""
    return JobState(
        spec=JobSpec(job_id=job_id, owner="", schedule=None, command=()),
        paused=False,
        deleted=True,
        created_ms=at,
        updated_ms=at,
        fired_ms=at,
        next_due_ms=None,
        live_runs=(),
        final_runs=(),
        recent_requests=(),
        version=0,
    )


def _owned_by_another(job: JobState, spec: JobSpec) -> bool:
    """A placeholder (version 0: only named as an upstream so far) belongs to no one."""
    return job.version > 0 and job.spec.owner != spec.owner


def _refused_secret(spec: JobSpec, config: LedgerConfig) -> str:
    """Why the spec may not be registered (its first secret the owner may not use), or
    "" when its owner may use every secret it names."""
    refused = config.secret_grants.refused(spec.owner, spec.secret_env)
    if not refused:
        return ""
    env, secret = refused[0]
    return f"job {spec.job_id!r}: " + refusal(spec.owner, env, secret)


def input_job(inp: LedgerInput) -> str:
    """The job whose log `inp` belongs to (the key it is written under)."""
    return inp.spec.job_id if isinstance(inp, JobUpserted) else inp.job_id


def _effective(stamp: int, now: int, config: LedgerConfig) -> int:
    """When a job change takes effect: its command's time (the broker's append time on
    `commands`, carried by ingress), so a change applies from its own time exactly even
    when ingress or the ledger lagged; never after the ledger's now, never older than
    the catch-up window."""
    return min(now, max(stamp, now - config.catchup_window_ms))


def _register(job: JobState | None, inp: JobUpserted, now: int, at: int) -> Decision:
    """A new job, or one re-created after its deletion, registered at `at`."""
    spec = inp.spec
    notices = dependency_links(spec.job_id, spec.owner, (), spec.depends_on, at)
    # Only times after registration are due (a re-created job too, but never at or
    # below a firing of the old life whose run was forgotten: the stub keeps every other
    # run after its deletion, so a time the new life shares with the old finds its run)...
    old_fired = None if job is None else job.forgotten_ms
    fired = at if old_fired is None else max(old_fired, at)
    if isinstance(spec.schedule, AtSchedule) and spec.schedule.at_ms <= at:
        # ...except a one-off whose time passed before it was registered (a command sent
        # just before its time, ingress lagging): it is proposed at once and follows the
        # misfire policy, so it runs or is recorded as skipped, never silently dropped.
        once = spec.schedule.at_ms - 1
        fired = once if old_fired is None else max(old_fired, once)
    # A re-created job keeps its first registration time: backfill creates runs only
    # before it, where the ledger never decided anything (a placeholder, version 0, never
    # decided anything at all). It keeps the old life's runs still live too: they count
    # for the concurrency policy and a later delete.
    first = at if job is None or job.version == 0 else job.created_ms
    # A one-off registered past is decided by its schedule, not left to a backfill.
    first = min(first, fired)
    new = JobState(
        spec=spec,
        paused=False,
        deleted=False,
        created_ms=first,
        updated_ms=now,
        fired_ms=fired,
        next_due_ms=due_after(spec, fired),
        live_runs=() if job is None else job.live_runs,
        final_runs=() if job is None else job.final_runs,
        recent_requests=() if job is None else job.recent_requests,
        version=1 if job is None else job.version + 1,
        dependents=() if job is None else job.dependents,
        upstream_outcomes=() if job is None else job.upstream_outcomes,
        requests_floor_ms=0 if job is None else job.requests_floor_ms,
        backfilled=() if job is None else job.backfilled,
        # max_runs counts the schedule's runs over the id's whole history: a delete
        # and re-create does not start it again (a withdrawal of the old life may still
        # be pending, and is given back when confirmed).
        schedule_runs=0 if job is None else job.schedule_runs,
        # The probes it started or passed: a probe's id is never given twice, deleted
        # or not (streams/core/ledger/dependencies.py).
        probes=() if job is None else job.probes,
        forgotten_ms=0 if job is None else job.forgotten_ms,
    )
    event = JobEvent(f"{spec.job_id}#job#{new.version}", spec.job_id, "upserted", at, spec)
    return Decision(job=new, events=(event,), notices=notices)
