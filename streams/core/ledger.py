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
- the one step back: an attempt claimed but never started (given back by its worker, or
  its worker lost before the attempt's start time) is dispatched again, same attempt.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from schemas.records import (
    FINAL_STATES,
    TRANSITIONS,
    BackfillRequested,
    CancelOrder,
    CancelRequested,
    ClaimReply,
    ClaimRequested,
    DeadlineKind,
    DeadlineReached,
    DependencyLinked,
    DispatchFailed,
    DispatchRequest,
    FireProposed,
    JobDeleted,
    JobEvent,
    JobPaused,
    JobResumed,
    JobState,
    JobUpserted,
    LedgerInput,
    RecentRequest,
    RerunRequested,
    RunEvent,
    RunFinished,
    RunNowRequested,
    RunReleased,
    RunStarted,
    RunState,
    RunStateName,
    Span,
    Trigger,
    UpstreamFinished,
    UpstreamOutcome,
    WorkerLost,
)
from schemas.spec import AtSchedule, JobSpec
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.schedule import fires_between, jitter_ms, next_fire
from streams.core.seals import sealed


@dataclass(frozen=True, slots=True)
class LedgerConfig:
    # A due run not claimed by a worker within this is dispatched again.
    claim_timeout_ms: int = 30_000
    # The worker kills a run at its timeout; the ledger declares it lost this much later.
    timeout_grace_ms: int = 30_000
    # A fire proposal arriving later than this after its time is a misfire.
    misfire_grace_ms: int = 60_000
    # Misfired times older than this before the proposal are skipped whatever the policy.
    catchup_window_ms: int = 24 * 3600 * 1000
    # At most this many runs are created for one late proposal (run_all).
    max_catchup_runs: int = 1000
    # Fire proposals may come this early (pre-dispatch lead window); earlier ones are bogus.
    max_lead_ms: int = 60_000
    # Finished runs kept per job (for rerun and duplicate reports) before being forgotten.
    keep_final_runs: int = 20
    keep_request_ids: int = 256
    # Backfilled spans kept per job; beyond it the two closest merge (the gap between
    # them can then no longer be backfilled: refused with a reason, never run twice).
    keep_spans: int = 32
    # A run waiting on its upstreams is skipped if they have not all finished by then.
    dependency_wait_ms: int = 24 * 3600 * 1000
    keep_upstream_outcomes: int = 256
    # The scheduler nodes' key for placement seals (streams/core/seals.py): when set, a
    # claim is granted only with the dispatcher's seal of that attempt on the claiming
    # worker. The ledger of a node always has it (streams/keys.py); None, no check, is
    # for the pure tests and benchmarks that play both the dispatcher and the worker.
    placement_key: bytes | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    job: JobState | None = None  # the new job state, when it changed
    runs: tuple[RunState, ...] = ()  # changed runs
    forget: tuple[str, ...] = ()  # run ids to drop from the run table (tombstones)
    events: tuple[RunEvent | JobEvent, ...] = ()
    dispatch: tuple[DispatchRequest, ...] = ()
    # Inputs for other jobs' logs (dependency links and upstream notices), written in the
    # same transaction as everything else.
    notices: tuple[DependencyLinked | UpstreamFinished, ...] = ()
    # Messages to workers (worker-inbox): claim replies and orders to stop an attempt.
    replies: tuple[ClaimReply | CancelOrder, ...] = ()
    rejected: str = ""  # why the input changed nothing, for logs and metrics
    # A user's command refused here rather than by ingress (it needs the job's state):
    # the ledger sends its record to commands.dlq with `rejected` as the reason.
    dead_letter: bool = False

    @property
    def changed(self) -> bool:
        return self.job is not None or bool(
            self.runs or self.forget or self.notices or self.replies
        )


RunLookup = Callable[[str], RunState | None]

# Why a scheduled run created ahead of its time was cancelled before it could start: such
# a firing is revived, not re-created, if the job fires it after all.
WITHDRAWN_BY_PAUSE = "job paused before the run was due"
WITHDRAWN_BY_DELETE = "job deleted before the run was due"
WITHDRAWN_BY_CHANGE = "schedule changed before the run was due"
WITHDRAWN = frozenset({WITHDRAWN_BY_PAUSE, WITHDRAWN_BY_DELETE, WITHDRAWN_BY_CHANGE})
# Said of a run cancelled while claimed whose holder started it (or may have) before the
# stop order reached it: such a firing is never revived.
STARTED = "it had started"
MAY_HAVE_STARTED = "it may have started"


def _withdrawn(run: RunState) -> bool:
    return run.state == "cancelled" and run.reason in WITHDRAWN


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
    if isinstance(inp, JobUpserted) and (job is None or job.deleted):
        return _register(job, inp, now, _effective(inp.at_ms, now, config))
    if job is None and isinstance(inp, DependencyLinked):
        job = _stub(inp.job_id, now)  # the upstream is not registered (yet)
    if job is None:
        return Decision(rejected=f"unknown job {_job_id(inp)}")
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


def _foreign(job: JobState, owner: str | None) -> bool:
    """A dependency record from another owner's job (None: written before the rule)."""
    return owner is not None and job.version > 0 and job.spec.owner != owner


def _job_id(inp: LedgerInput) -> str:
    return inp.spec.job_id if isinstance(inp, JobUpserted) else inp.job_id


def _next_due(spec: JobSpec, after_ms: int) -> int | None:
    return next_fire(spec.schedule, after_ms, spec.dst)


def _effective(stamp: int, now: int, config: LedgerConfig) -> int:
    """When a job change takes effect: its command's time (the broker's append time on
    `commands`, carried by ingress), so a change applies from its own time exactly even
    when ingress or the ledger lagged; never after the ledger's now, never older than
    the catch-up window."""
    return min(now, max(stamp, now - config.catchup_window_ms))


def _register(job: JobState | None, inp: JobUpserted, now: int, at: int) -> Decision:
    """A new job, or one re-created after its deletion, registered at `at`."""
    spec = inp.spec
    notices = _links(spec.job_id, spec.owner, (), spec.depends_on, at)
    # Only times after registration are due (a re-created job starts afresh, but never
    # below the old watermark: those times were decided once already)...
    old_fired = None if job is None else job.fired_ms
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
    new = JobState(
        spec=spec,
        paused=False,
        deleted=False,
        created_ms=first,
        updated_ms=now,
        fired_ms=fired,
        next_due_ms=_next_due(spec, fired),
        live_runs=() if job is None else job.live_runs,
        final_runs=() if job is None else job.final_runs,
        recent_requests=() if job is None else job.recent_requests,
        version=1 if job is None else job.version + 1,
        dependents=() if job is None else job.dependents,
        upstream_outcomes=() if job is None else job.upstream_outcomes,
        requests_floor_ms=0 if job is None else job.requests_floor_ms,
        backfilled=() if job is None else job.backfilled,
    )
    event = JobEvent(f"{spec.job_id}#job#{new.version}", spec.job_id, "upserted", at, spec)
    return Decision(job=new, events=(event,), notices=notices)


def _merge(spans: tuple[Span, ...], new: Span, keep: int) -> tuple[Span, ...]:
    """Add a span, merging overlapping or touching ones; at most `keep` spans."""
    merged: list[Span] = []
    for span in sorted((*spans, new), key=lambda s: s.after_ms):
        if merged and span.after_ms <= merged[-1].until_ms:
            last = merged[-1]
            merged[-1] = Span(last.after_ms, max(last.until_ms, span.until_ms))
        else:
            merged.append(span)
    while len(merged) > keep:
        gaps = [merged[i + 1].after_ms - merged[i].until_ms for i in range(len(merged) - 1)]
        i = gaps.index(min(gaps))
        merged[i : i + 2] = [Span(merged[i].after_ms, merged[i + 1].until_ms)]
    return tuple(merged)


def _links(
    job_id: str, owner: str, before: tuple[str, ...], after: tuple[str, ...], at: int
) -> tuple[DependencyLinked, ...]:
    """Tell each upstream added or removed that `job_id` (of `owner`) depends on it (or
    no longer)."""
    added = [DependencyLinked(u, job_id, True, at, owner) for u in after if u not in before]
    removed = [DependencyLinked(u, job_id, False, at, owner) for u in before if u not in after]
    return tuple(added + removed)


class _Builder:
    """Accumulates one decision. Methods validate, then change state through `_move`."""

    def __init__(self, job: JobState, runs: RunLookup, at: int, config: LedgerConfig):
        self.job = job
        self.lookup = runs
        self.at = at
        self.config = config
        self.changed_job = False
        self.runs: dict[str, RunState] = {}
        self.forget: list[str] = []
        self.events: list[RunEvent | JobEvent] = []
        self.dispatch: list[DispatchRequest] = []
        self.notices: list[DependencyLinked | UpstreamFinished] = []
        self.replies: list[ClaimReply | CancelOrder] = []
        self.rejected = ""

    # -- plumbing ---------------------------------------------------------------------
    def decision(self) -> Decision:
        return Decision(
            job=self.job if self.changed_job else None,
            runs=tuple(self.runs.values()),
            forget=tuple(self.forget),
            events=tuple(self.events),
            dispatch=tuple(self.dispatch),
            notices=tuple(self.notices),
            replies=tuple(self.replies),
            rejected=self.rejected,
        )

    def reject(self, reason: str) -> None:
        self.rejected = reason

    def run(self, run_id: str) -> RunState | None:
        if run_id in self.runs:
            return self.runs[run_id]
        return None if run_id in self.forget else self.lookup(run_id)

    def set_job(self, **changes: object) -> None:
        self.job = replace(self.job, updated_ms=self.at, **changes)  # type: ignore[arg-type]
        self.changed_job = True

    def _move(
        self,
        run: RunState,
        state: RunStateName,
        reason: str = "",
        *,
        attempt: int | None = None,
        worker_id: str | None = None,
        deadline: tuple[int, DeadlineKind] | None = None,
        exit_code: int | None = None,
    ) -> RunState:
        """Record one transition: new run state, its event, and the job's run lists."""
        before = None if run.seq <= 0 else run.state
        if state not in TRANSITIONS[before]:  # a bug in this module, never an input's fault
            raise AssertionError(f"{run.run_id}: {before} -> {state} is not a legal transition")
        attempt = run.attempt if attempt is None else attempt
        worker = run.worker_id if worker_id is None else worker_id
        final = state in FINAL_STATES
        moved = replace(
            run,
            state=state,
            attempt=attempt,
            worker_id=worker,
            updated_ms=self.at,
            deadline_ms=None if deadline is None else deadline[0],
            deadline_kind=None if deadline is None else deadline[1],
            started_ms=self.at if state == "running" else run.started_ms,
            finished_ms=self.at if final else run.finished_ms,
            exit_code=exit_code if exit_code is not None else run.exit_code,
            reason=reason,
            seq=run.seq + 1,
            cancelling="",  # a transition settles a pending cancel (see `_cancel_run`)
        )
        self.runs[run.run_id] = moved
        self.events.append(
            RunEvent(
                event_id=f"{run.run_id}#{moved.seq}",
                job_id=run.job_id,
                run_id=run.run_id,
                scheduled_ms=run.scheduled_ms,
                trigger=run.trigger,
                attempt=attempt,
                state=state,
                at_ms=self.at,
                worker_id=worker,
                reason=reason,
                exit_code=exit_code,
            )
        )
        if final:
            self._retire(run.run_id)
            if run.trigger != "manual" and self.job.dependents:
                spec = self.job.spec
                after = next_fire(spec.schedule, run.scheduled_ms, spec.dst)
                for dependent in self.job.dependents:
                    self.notices.append(
                        UpstreamFinished(
                            dependent,
                            run.job_id,
                            run.scheduled_ms,
                            state == "succeeded",
                            self.at,
                            after,
                            spec.owner,
                        )
                    )
        return moved

    def _retire(self, run_id: str) -> None:
        keep = self.config.keep_final_runs
        live = tuple(r for r in self.job.live_runs if r != run_id)
        finals = (*self.job.final_runs, run_id)
        if len(finals) > keep:
            self.forget.extend(finals[: len(finals) - keep])
            for gone in finals[: len(finals) - keep]:
                self.runs.pop(gone, None)
            finals = finals[len(finals) - keep :]
        self.set_job(live_runs=live, final_runs=finals)

    def _create(
        self,
        scheduled: int,
        trigger: Trigger,
        run_id: str,
        request_id: str = "",
        period_start: int | None = None,
    ) -> None:
        """A new run: `due` at once, or `waiting` on upstreams for (period_start, scheduled]."""
        spec = self.job.spec
        run = self._fresh_run(run_id, scheduled, trigger, request_id, period_start)
        self.set_job(live_runs=(*self.job.live_runs, run_id))
        if spec.depends_on and period_start is not None:
            wait = scheduled + self.config.dependency_wait_ms
            self._evaluate(self._move(run, "waiting", deadline=(wait, "dependency")))
        else:
            self._release(run, "")

    def _fresh_run(
        self,
        run_id: str,
        scheduled: int,
        trigger: Trigger,
        request_id: str = "",
        period_start: int | None = None,
    ) -> RunState:
        """A run before its first transition (`_move` gives it its state and event)."""
        return RunState(
            run_id=run_id,
            job_id=self.job.spec.job_id,
            scheduled_ms=scheduled,
            trigger=trigger,
            state="due",
            attempt=1,
            worker_id="",
            created_ms=self.at,
            updated_ms=self.at,
            deadline_ms=None,
            deadline_kind=None,
            started_ms=None,
            finished_ms=None,
            exit_code=None,
            reason="",
            seq=0,
            request_id=request_id,
            period_start_ms=period_start,
        )

    def _release(self, run: RunState, reason: str) -> None:
        spec = self.job.spec
        not_before = max(
            run.scheduled_ms + jitter_ms(spec.job_id, run.scheduled_ms, spec.jitter_s), self.at
        )
        self._due(run, run.attempt, not_before, reason)

    def _evaluate(self, run: RunState) -> None:
        """Release a waiting run when every upstream succeeded for its period; skip it
        when one finally did not; else leave it waiting."""
        start = run.period_start_ms if run.period_start_ms is not None else run.scheduled_ms - 1
        pending = []
        for upstream in self.job.spec.depends_on:
            outcome = self._outcome(upstream, start, run.scheduled_ms)
            later = (
                outcome is not None
                and outcome.next_ms is not None
                and (outcome.next_ms <= run.scheduled_ms)
            )
            if outcome is None or later:  # not finished, or a later run is in the period
                pending.append(upstream)
            elif not outcome.succeeded:
                self._move(run, "skipped", f"upstream {upstream} did not succeed")
                return
        if not pending:
            self._release(run, "upstreams succeeded")

    def _outcome(self, upstream: str, after: int, until: int) -> UpstreamOutcome | None:
        """The upstream's latest outcome scheduled in (after, until]."""
        best: UpstreamOutcome | None = None
        for o in self.job.upstream_outcomes:
            if (
                o.upstream == upstream
                and after < o.scheduled_ms <= until
                and (best is None or o.scheduled_ms > best.scheduled_ms)
            ):
                best = o
        return best

    def _due(self, run: RunState, attempt: int, not_before: int, reason: str) -> None:
        """Make (run, attempt) due and ask the dispatcher to place it, to start no
        earlier than `not_before` (kept in the run state: see `_not_before`)."""
        deadline = max(self.at, not_before) + self.config.claim_timeout_ms
        moved = self._move(
            run, "due", reason, attempt=attempt, worker_id="", deadline=(deadline, "claim")
        )
        moved = self.runs[run.run_id] = replace(moved, not_before_ms=not_before)
        self._dispatch(moved, not_before)

    def _not_before(self, run: RunState) -> int | None:
        """The current attempt's start time: no worker starts it earlier. Every dispatch of
        the attempt carries this time or a later one. None when unknown (a state written
        before it was kept, for a retry or a rerun: their start time has long passed)."""
        if run.not_before_ms is not None:
            return run.not_before_ms
        if run.attempt == 1:  # a first attempt starts at its time plus the stable jitter
            spec = self.job.spec
            return run.scheduled_ms + jitter_ms(spec.job_id, run.scheduled_ms, spec.jitter_s)
        return None

    def _dispatch(self, run: RunState, not_before: int) -> None:
        spec = self.job.spec
        self.dispatch.append(
            DispatchRequest(
                run_id=run.run_id,
                job_id=run.job_id,
                attempt=run.attempt,
                owner=spec.owner,
                command=spec.command,
                env=spec.env,
                secret_env=spec.secret_env,
                resources=spec.resources,
                timeout_s=spec.timeout_s,
                priority=spec.priority,
                scheduled_ms=run.scheduled_ms,
                not_before_ms=not_before,
                at_ms=self.at,
            )
        )

    def _skip(self, scheduled: int, trigger: Trigger, reason: str) -> None:
        """A firing decided not to run: recorded as a run that is at once `skipped`."""
        run_id = scheduled_run_id(self.job.spec.job_id, scheduled)
        run = replace(self._fresh_run(run_id, scheduled, trigger), seq=-1)
        self.set_job(live_runs=(*self.job.live_runs, run_id))
        self._move(run, "skipped", reason)

    # -- job changes ------------------------------------------------------------------
    def respec(self, inp: JobUpserted, at: int) -> None:
        """A registered job's spec changes at `at`: the old schedule's firings up to `at`
        are decided first, then the new schedule applies from `at` exactly, and runs
        created ahead for times after `at` that the new schedule does not have are
        withdrawn."""
        spec, old = inp.spec, self.job.spec
        retimed = spec.schedule != old.schedule or spec.dst != old.dst
        if retimed:
            self._decide_until(at)
            kept = spec  # the new schedule's own times stay: the change keeps those firings
            self._withdraw(
                at,
                WITHDRAWN_BY_CHANGE,
                keep=lambda t: next_fire(kept.schedule, t - 1, kept.dst) == t,
            )
        job = self.job
        fired = at if retimed else job.fired_ms
        self.notices.extend(_links(spec.job_id, spec.owner, old.depends_on, spec.depends_on, at))
        self.set_job(
            spec=spec,
            fired_ms=fired,
            next_due_ms=None if job.paused else _next_due(spec, fired),
            version=job.version + 1,
        )
        self._job_event("upserted", at, spec)

    def _job_event(self, kind: str, at: int, spec: JobSpec | None = None) -> None:
        job_id = self.job.spec.job_id
        self.events.append(
            JobEvent(f"{job_id}#job#{self.job.version}", job_id, kind, at, spec)  # type: ignore[arg-type]
        )

    def _decide_until(self, at: int) -> None:
        """Decide the schedule's firings up to `at` that no proposal has decided yet: a
        change at `at` must not swallow a firing that was due before it."""
        job = self.job
        if job.paused or job.deleted:
            return
        upcoming = _next_due(job.spec, job.fired_ms)
        if upcoming is not None and upcoming <= at:
            self._decide_up_to(self._last_fire_at_or_before(at))

    def _withdraw(
        self, after: int, reason: str, keep: Callable[[int], bool] = lambda _: False
    ) -> None:
        """Cancel the scheduled runs for times after `after` that were created ahead and
        cannot have started (waiting, due, or claimed with a start time still to come).
        A firing withdrawn so may be revived (see `_fire_one`) if the job fires it
        after all: a resume, a re-creation or another change before its time."""
        for run_id in self.job.live_runs:
            run = self.run(run_id)
            if (
                run is None
                or run.trigger != "schedule"
                or run.scheduled_ms <= after
                or keep(run.scheduled_ms)
            ):
                continue
            start = self._not_before(run)
            if run.state in ("waiting", "due") or (
                run.state == "dispatched" and start is not None and start > self.at
            ):
                self._cancel_run(run, reason)

    def job_flag(self, inp: JobPaused | JobResumed | JobDeleted, at: int) -> None:
        job = self.job
        if job.deleted:
            return self.reject(f"job {job.spec.job_id} is deleted")
        if isinstance(inp, JobPaused):
            if job.paused:
                return self.reject("already paused")
            # Firings due before the pause run; those created ahead for after it go.
            self._decide_until(at)
            self._withdraw(at, WITHDRAWN_BY_PAUSE)
            self.set_job(paused=True, next_due_ms=None, fired_ms=self._fired_back_to(at))
            kind = "paused"
        elif isinstance(inp, JobResumed):
            if not job.paused:
                return self.reject("not paused")
            # Firings during the pause are not due: the watermark moves to the resume.
            fired = max(job.fired_ms, at)
            self.set_job(paused=False, fired_ms=fired, next_due_ms=_next_due(job.spec, fired))
            kind = "resumed"
        else:
            self._decide_until(at)
            self._withdraw(at, WITHDRAWN_BY_DELETE)
            for run_id in self.job.live_runs:
                run = self.run(run_id)
                if run is not None and run.state in ("waiting", "due", "retrying"):
                    self._stop_order(run, "job deleted")
                    self._move(run, "cancelled", "job deleted")
            self.notices.extend(
                _links(job.spec.job_id, job.spec.owner, job.spec.depends_on, (), at)
            )
            self._compact_deleted(at)
            kind = "deleted"
        self.set_job(version=self.job.version + 1)
        self._job_event(kind, at)
        return None

    def _fired_back_to(self, at: int) -> int:
        """The watermark after a pause or delete at `at`: back to `at`, so withdrawn
        firings may be revived, but never below a later firing that was not withdrawn
        (one that may have started before the change reached the ledger): that firing
        stays decided even once its run is forgotten."""
        kept = [
            run.scheduled_ms
            for run in (self.run(r) for r in (*self.job.live_runs, *self.job.final_runs))
            if run is not None
            and run.trigger == "schedule"
            and run.scheduled_ms > at
            and not _withdrawn(run)
            and run.cancelling not in WITHDRAWN  # withdrawn once its holder answers
        ]
        return min(self.job.fired_ms, max([at, *kept]))

    def _compact_deleted(self, at: int) -> None:
        """A deleted job keeps a small stub, not a tombstone: its version (event ids stay
        unique if it is re-created), watermark, first registration time, backfilled
        spans, request memory and dependents. Its final runs are forgotten, except the
        firings withdrawn ahead of their time, which a re-creation may revive."""
        fired = self._fired_back_to(at)  # before forgetting: it reads the final runs
        keep: list[str] = []
        for run_id in self.job.final_runs:
            run = self.run(run_id)
            if run is not None and run.reason == WITHDRAWN_BY_DELETE and run.scheduled_ms > at:
                keep.append(run_id)
            else:
                self.forget.append(run_id)
                self.runs.pop(run_id, None)
        self.set_job(
            deleted=True,
            next_due_ms=None,
            fired_ms=fired,
            final_runs=tuple(keep),
            upstream_outcomes=(),
        )

    # -- firings ----------------------------------------------------------------------
    def fire(self, inp: FireProposed) -> None:
        job, spec, cfg = self.job, self.job.spec, self.config
        if job.deleted or job.paused:
            return self.reject("job is paused or deleted")
        if inp.scheduled_ms <= job.fired_ms:
            return self.reject("already decided")  # the common duplicate: no change
        if inp.scheduled_ms - self.at > cfg.max_lead_ms:
            return self.reject("proposed too early")
        if spec.concurrency != "allow" and inp.scheduled_ms > self.at:
            # forbid/replace look at the previous run at the firing's time, not before:
            # decided early, replace would cancel a run about to finish and forbid would
            # skip for a run that would have ended in time.
            return self.reject("proposed before its time (concurrency is decided at it)")
        if next_fire(spec.schedule, inp.scheduled_ms - 1, spec.dst) != inp.scheduled_ms:
            return self.reject("not a fire time of the schedule")
        floor = self._floor(inp.scheduled_ms)
        following = next_fire(spec.schedule, inp.scheduled_ms, spec.dst)
        if (
            floor < inp.scheduled_ms
            and (following is None or following > self.at)
            and next_fire(spec.schedule, floor, spec.dst) == inp.scheduled_ms
        ):
            # The common case, in three (cached) schedule computations instead of six:
            # nothing lies between the floor and the proposal and the next time is not due
            # yet, so the proposal is the only time to decide.
            self._decide_times([inp.scheduled_ms], inp.scheduled_ms, following)
        else:
            # Everything undecided up to the proposal, or up to now when it comes late.
            self._decide_up_to(max(inp.scheduled_ms, self._last_fire_at_or_before(self.at)))
        return None

    def _floor(self, latest: int) -> int:
        """Times above this and up to `latest` are undecided and within the catch-up
        window; `latest` itself always is, however late it comes."""
        window = min(self.at - self.config.catchup_window_ms, latest - 1)
        return max(self.job.fired_ms, window)

    def _decide_up_to(self, latest_due: int) -> None:
        spec = self.job.spec
        # All of the window, then the newest `max_catchup_runs` of them: the newest are
        # the ones that matter (the on-time firing is among them); older ones are dropped.
        times = fires_between(
            spec.schedule, self._floor(latest_due), latest_due, spec.dst, limit=10_000_000
        )
        self._decide_times(times, latest_due, _next_due(spec, latest_due))

    def _decide_times(self, times: list[int], latest_due: int, next_due: int | None) -> None:
        job, spec, cfg = self.job, self.job.spec, self.config
        if len(times) > cfg.max_catchup_runs:
            times = times[-cfg.max_catchup_runs :]
        late = [t for t in times if self.at - t > cfg.misfire_grace_ms]
        timely = [t for t in times if self.at - t <= cfg.misfire_grace_ms]
        run_late: set[int] = set()
        if spec.misfire == "run_all":
            run_late = set(late)
        elif spec.misfire == "run_once" and late and not timely:
            run_late = {late[-1]}
        previous = job.fired_ms
        for t in times:
            if t in run_late or t in timely:
                self._fire_one(t, previous)
            elif self.run(scheduled_run_id(spec.job_id, t)) is None:
                self._skip(t, "schedule", f"misfire ({spec.misfire})")
            # else: decided once already (the watermark went back for a change), and a
            # withdrawn firing missed for good keeps its record
            previous = t
        self.set_job(fired_ms=max(self.job.fired_ms, latest_due), next_due_ms=next_due)

    def _last_fire_at_or_before(self, t: int) -> int:
        """The newest fire time <= t, or the watermark when there is none after it."""
        spec = self.job.spec
        window_start = max(self.job.fired_ms, t - self.config.catchup_window_ms)
        times = fires_between(spec.schedule, window_start, t, spec.dst, limit=1_000_000)
        return times[-1] if times else self.job.fired_ms

    def _fire_one(self, scheduled: int, period_start: int) -> None:
        spec = self.job.spec
        run_id = scheduled_run_id(spec.job_id, scheduled)
        existing = self.run(run_id)
        if existing is not None and existing.cancelling in WITHDRAWN:
            # Withdrawn, but its holder has not answered yet: the firing is wanted after
            # all, so the run stays. Should the stop order make the holder give the
            # attempt back, it is dispatched again like any attempt given back.
            self.runs[run_id] = replace(existing, cancelling="", updated_ms=self.at)
            return None
        if existing is not None and not _withdrawn(existing):
            return None  # decided once already: one run per (job, scheduled time)
        live = [r for r in (self.run(x) for x in self.job.live_runs) if r and not r.final]
        if live and spec.concurrency == "forbid":
            if existing is not None:
                return None  # stays withdrawn: its record says it did not run
            return self._skip(scheduled, "schedule", f"concurrency forbid: {live[0].run_id} live")
        if live and spec.concurrency == "replace":
            for old in live:
                self._cancel_run(old, f"replaced by {run_id}")
        if existing is not None:
            return self._revive(existing, period_start)
        self._create(scheduled, "schedule", run_id, period_start=period_start)
        return None

    def _revive(self, run: RunState, period_start: int) -> None:
        """A firing withdrawn ahead of its time is due again after all (the job resumed,
        was re-created or changed back before it): the same run, a new attempt, so any
        worker still holding the withdrawn attempt can neither start nor report it."""
        self.set_job(
            live_runs=(*self.job.live_runs, run.run_id),
            final_runs=tuple(r for r in self.job.final_runs if r != run.run_id),
        )
        revived = replace(run, attempt=run.attempt + 1, period_start_ms=period_start)
        if self.job.spec.depends_on:
            wait = run.scheduled_ms + self.config.dependency_wait_ms
            moved = self._move(
                revived,
                "waiting",
                "revived",
                attempt=revived.attempt,
                deadline=(wait, "dependency"),
            )
            self._evaluate(moved)
        else:
            self._release(revived, "revived: due again")

    def _duplicate(self, request_id: str, at: int) -> str:
        """Why a request was applied already (or may have been), or "" if it is new."""
        if not request_id:
            return ""
        if any(r.request_id == request_id for r in self.job.recent_requests):
            return "duplicate request"
        if at <= self.job.requests_floor_ms:
            return "request older than the ledger's memory of requests (may be a duplicate)"
        return ""

    def _remember(self, request_id: str, at: int) -> None:
        if not request_id:
            return
        keep = self.config.keep_request_ids
        kept = (*self.job.recent_requests, RecentRequest(request_id, at))
        floor = max([self.job.requests_floor_ms, *(r.at_ms for r in kept[:-keep])])
        self.set_job(recent_requests=kept[-keep:], requests_floor_ms=floor)

    def run_now(self, inp: RunNowRequested) -> None:
        if self.job.deleted:
            return self.reject("job is deleted")
        run_id = manual_run_id(self.job.spec.job_id, inp.request_id)
        duplicate = self._duplicate(inp.request_id, inp.at_ms)
        if duplicate or self.run(run_id) is not None:
            return self.reject(duplicate or "duplicate request")
        self._remember(inp.request_id, inp.at_ms)
        self._create(self.at, "manual", run_id, inp.request_id)
        return None

    def backfill(self, inp: BackfillRequested) -> None:
        """Runs for times the schedule never decided: before the job's registration, and
        not decided by an earlier backfill (the spans say so even once its runs are
        forgotten)."""
        spec, cfg = self.job.spec, self.config
        if self.job.deleted:
            return self.reject("job is deleted")
        duplicate = self._duplicate(inp.request_id, inp.at_ms)
        if duplicate:
            return self.reject(duplicate)
        upper = min(inp.to_ms, self.job.created_ms)
        times = fires_between(
            spec.schedule, inp.from_ms - 1, upper, spec.dst, limit=cfg.max_catchup_runs
        )
        spans = self.job.backfilled
        fresh = [
            t
            for t in times
            if not any(s.after_ms < t <= s.until_ms for s in spans)
            and self.run(scheduled_run_id(spec.job_id, t)) is None
        ]
        self._remember(inp.request_id, inp.at_ms)
        if not fresh:
            return self.reject("nothing to backfill: before registration, not backfilled yet")
        previous = inp.from_ms - 1
        for t in fresh:
            self._create(t, "backfill", scheduled_run_id(spec.job_id, t), period_start=previous)
            previous = t
        # Decided: (from - 1, the last time created]; limited runs may end before `upper`.
        self.set_job(backfilled=_merge(spans, Span(inp.from_ms - 1, fresh[-1]), cfg.keep_spans))
        return None

    def rerun(self, inp: RerunRequested) -> None:
        run = self.run(inp.run_id)
        duplicate = self._duplicate(inp.request_id, inp.at_ms)
        if duplicate:
            return self.reject(duplicate)
        if run is None:
            return self.reject(f"unknown or forgotten run {inp.run_id}")
        if not run.final:
            return self.reject(f"run {inp.run_id} is still {run.state}")
        self._remember(inp.request_id, inp.at_ms)
        self.set_job(
            live_runs=(*self.job.live_runs, run.run_id),
            final_runs=tuple(r for r in self.job.final_runs if r != run.run_id),
        )
        self._due(run, run.attempt + 1, self.at, f"rerun {inp.request_id}")
        return None

    # -- dependencies -----------------------------------------------------------------
    def link(self, inp: DependencyLinked) -> None:
        job = self.job
        if inp.linked and _foreign(job, inp.owner):
            # Another owner's job may not hang on this one: it would learn its outcomes
            # (through its skip reasons) and grow its dependents without bound.
            return self.reject(
                f"{inp.dependent} (owner {inp.owner!r}) cannot depend on {job.spec.job_id} "
                f"of owner {job.spec.owner!r}"
            )
        dependents = tuple(d for d in self.job.dependents if d != inp.dependent)
        if inp.linked:
            dependents = (*dependents, inp.dependent)
        if dependents == self.job.dependents:
            return self.reject("link unchanged")
        self.set_job(dependents=dependents)

    def upstream_finished(self, inp: UpstreamFinished) -> None:
        job = self.job
        if job.deleted or inp.upstream not in job.spec.depends_on:
            return self.reject(f"{inp.upstream} is not an upstream of {job.spec.job_id}")
        if _foreign(job, inp.owner):
            # An upstream registered by another owner (the id was a placeholder when this
            # job named it): its outcomes are not this job's to see; the periods it
            # would have decided are skipped when the dependency wait runs out.
            return self.reject(f"{inp.upstream} belongs to owner {inp.owner!r}")
        outcome = UpstreamOutcome(
            inp.upstream, inp.scheduled_ms, inp.succeeded, inp.upstream_next_ms
        )
        kept = [
            o
            for o in job.upstream_outcomes
            if (o.upstream, o.scheduled_ms) != (inp.upstream, inp.scheduled_ms)
        ]
        kept.append(outcome)
        kept.sort(key=lambda o: o.scheduled_ms)
        self.set_job(upstream_outcomes=tuple(kept[-self.config.keep_upstream_outcomes :]))
        if job.spec.schedule is None:
            return self._dag_steps()
        for run_id in job.live_runs:
            run = self.run(run_id)
            if run is not None and run.state == "waiting":
                self._evaluate(run)

    def _dag_steps(self) -> None:
        """A job without a schedule runs once per period in which all its upstreams
        succeeded. Periods are decided in order, each by its own upstreams' outcomes
        whatever order their notices arrive in (they come from other partitions): the
        period ending at t is (fired, t], decided once every upstream has an outcome in
        it, run if all succeeded, recorded as skipped if one did not, or if some upstream
        has not finished within `dependency_wait_ms`. A time an upstream reports but
        another does not (an upstream on a slower schedule) joins the next period."""
        job = self.job
        if job.paused:
            return
        upstreams = job.spec.depends_on
        blocked = False  # an earlier period is still open: no failure may skip past it
        for t in sorted({o.scheduled_ms for o in job.upstream_outcomes}):
            after = self.job.fired_ms
            if t <= after:
                continue
            outcomes = {u: self._outcome(u, after, t) for u in upstreams}
            missing = [u for u, o in outcomes.items() if o is None]
            failed = [u for u, o in outcomes.items() if o is not None and not o.succeeded]
            failed_at_t = any(
                o is not None and not o.succeeded and o.scheduled_ms == t for o in outcomes.values()
            )
            if (
                missing
                and not (failed_at_t and not blocked)
                and self.at - t <= self.config.dependency_wait_ms
            ):
                blocked = True
                continue
            self.set_job(fired_ms=t)
            if missing and not failed:
                why = f"upstream {missing[0]} did not finish in time"
                self._skip(t, "dependency", why)
            elif failed:
                self._skip(t, "dependency", f"upstream {failed[0]} did not succeed")
            else:
                self._create(t, "dependency", scheduled_run_id(job.spec.job_id, t))
        # Outcomes of decided periods are never read again.
        fired = self.job.fired_ms
        kept = tuple(o for o in self.job.upstream_outcomes if o.scheduled_ms > fired)
        if kept != self.job.upstream_outcomes:
            self.set_job(upstream_outcomes=kept)

    def cancel(self, inp: CancelRequested) -> None:
        run = self.run(inp.run_id)
        if run is None or run.final:
            return self.reject("run is not live")
        self._cancel_run(run, "cancelled by request")

    def _cancel_run(self, run: RunState, reason: str) -> None:
        """Cancel a live run. A claimed attempt not reported started may start before the
        stop order reaches its worker (the order travels through worker-inbox, the start
        is the worker's own timer): were it cancelled now, that execution would be one the
        record denies, and a revived firing could run beside it. So it stays `dispatched`
        with the cancel pending, and the holder's answer settles it: given back (or
        asking for the claim again, or declared lost) -> cancelled; started -> running,
        then cancelled (the order stops it); finished -> its outcome. Every other run is
        cancelled at once (a running one is stopped by the order)."""
        if run.state == "dispatched" and run.worker_id:
            if not run.cancelling:
                self._stop_order(run, reason)
            elif reason in WITHDRAWN or run.cancelling not in WITHDRAWN:
                return  # pending already, for a reason as final (a withdrawal may be undone)
            self.runs[run.run_id] = replace(run, cancelling=reason, updated_ms=self.at)
            return
        self._stop_order(run, reason)
        self._move(run, "cancelled", reason)

    def _settle_cancel(
        self, run: RunState, started: str = "", exit_code: int | None = None
    ) -> None:
        """The holder of an attempt with a cancel pending answered, or was declared lost:
        the run is cancelled. Given back unstarted, it keeps the cancel's own reason (a
        withdrawn firing is known by it, and may be revived); if it started, or may have
        (`started` says which), the reason says so and the firing is never revived."""
        reason = f"{run.cancelling} ({started})" if started else run.cancelling
        self._move(run, "cancelled", reason, exit_code=exit_code)

    # -- worker traffic ---------------------------------------------------------------
    def _current(self, run_id: str, attempt: int) -> RunState | None:
        run = self.run(run_id)
        if run is None or run.final:
            self.reject("run is not live")
            return None
        if attempt != run.attempt:
            self.reject(f"stale attempt {attempt} (current {run.attempt})")
            return None
        return run

    def _sealed(self, inp: ClaimRequested | RunStarted | RunFinished | RunReleased) -> bool:
        """Whether a worker's record carries the seal of its attempt's placement on the
        worker it names (always, without a key: the pure tests that play every part)."""
        key = self.config.placement_key
        return key is None or sealed(key, inp.placement, inp.run_id, inp.attempt, inp.worker_id)

    def _unsealed(self, inp: RunStarted | RunFinished | RunReleased, what: str) -> bool:
        """Refuse a report without its placement's seal: a worker id is forgeable, the
        seal reaches only the worker the attempt was placed on (through its own inbox),
        so another worker cannot report it started, done or given back."""
        if self._sealed(inp):
            return False
        self.reject(f"{what} of {inp.run_id}#{inp.attempt} by {inp.worker_id} without its seal")
        return True

    def claim(self, inp: ClaimRequested) -> None:
        """First claim of the current attempt wins; every claimant gets an answer."""
        run = self._current(inp.run_id, inp.attempt)
        if run is not None and run.state == "due" and not self._sealed(inp):
            # Not placed there (or a forged claim): the attempt stays due for the worker
            # it was placed on, and its claim deadline re-dispatches it if none claims.
            self.reject(f"{inp.run_id}#{inp.attempt} was not placed on {inp.worker_id}")
            granted, reason = False, self.rejected
        elif run is not None and run.state == "due":
            # Counted from the start time: the timeout never strikes before the run could
            # start (a jitter may put that well after the scheduled time).
            start = self._not_before(run)
            backstop = self._timeout_backstop(
                max(self.at, run.scheduled_ms if start is None else start)
            )
            self._move(
                run, "dispatched", "", worker_id=inp.worker_id, deadline=(backstop, "timeout")
            )
            granted, reason = True, ""
        elif (
            run is not None
            and run.worker_id == inp.worker_id
            and run.state == "dispatched"
            and run.cancelling
        ):
            # The holder asks again (a restarted worker re-asks the claims its journal
            # holds unanswered): it has not started the attempt, which answers the order.
            self._settle_cancel(run)
            granted, reason = False, "cancelled"
        elif run is not None and run.worker_id == inp.worker_id and run.state == "dispatched":
            granted, reason = True, "already granted"  # a repeated claim: answer again
        else:
            if run is not None:
                self.reject(f"already claimed by {run.worker_id or 'nobody'} ({run.state})")
            granted, reason = False, self.rejected
        # The reply carries the claim's own stamp, not the ledger's now: the worker
        # matches a reply to the claim it answers by it (a late reply to an earlier
        # claim of the same attempt must not pass for the answer to a later one).
        self.replies.append(
            ClaimReply(
                inp.worker_id, inp.run_id, inp.attempt, granted, reason, inp.at_ms, inp.placement
            )
        )

    def _stop_order(self, run: RunState, reason: str) -> None:
        """Tell the worker holding (run, attempt) to stop it, if one holds it."""
        if run.worker_id and run.state in ("dispatched", "running"):
            self.replies.append(
                CancelOrder(run.worker_id, run.run_id, run.attempt, reason, self.at)
            )

    def dispatch_failed(self, inp: DispatchFailed) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.state != "due":
            return self.reject(f"dispatch failure for a run that is {run.state}")
        self._move(run, "failed", inp.reason)
        return None

    def started(self, inp: RunStarted) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if self._unsealed(inp, "start"):
            return None
        if run.worker_id != inp.worker_id or run.state != "dispatched":
            return self.reject(f"start by {inp.worker_id} while {run.state} on {run.worker_id}")
        pending = run.cancelling
        running = self._move(run, "running", deadline=(self._timeout_backstop(self.at), "timeout"))
        if pending:
            # It started before the stop order reached it: recorded, then cancelled (the
            # order, already on its way, stops it; sent again for a restarted worker).
            self._stop_order(running, pending)
            self._move(running, "cancelled", f"{pending} ({STARTED})")

    def _timeout_backstop(self, start: int) -> int:
        return start + int(self.job.spec.timeout_s * 1000) + self.config.timeout_grace_ms

    def finished(self, inp: RunFinished) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if self._unsealed(inp, "report"):
            return None
        if run.worker_id != inp.worker_id or run.state not in ("dispatched", "running"):
            return self.reject(f"report by {inp.worker_id} while {run.state} on {run.worker_id}")
        if inp.exit_code == 0:
            self._move(run, "succeeded", exit_code=0)
            return None
        if run.cancelling:  # it ran, and was stopped by the order (or failed): no retry
            return self._settle_cancel(run, STARTED, exit_code=inp.exit_code)
        reason = inp.error or (
            f"exit code {inp.exit_code}" if inp.exit_code is not None else "killed"
        )
        # An attempt whose effects are unknown: lost (the worker's executor died, it
        # restarted) or fenced (killed mid-run because the worker could not prove it was
        # alive). Like a WorkerLost verdict: only idempotent jobs run again.
        lost = inp.exit_code is None and inp.error.startswith(("lost", "fenced"))
        retry = not lost or self.job.spec.idempotent
        self._fail_attempt(run, reason, retry_allowed=retry, exit_code=inp.exit_code)

    def lost(self, inp: WorkerLost) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.worker_id != inp.worker_id or run.state not in ("dispatched", "running"):
            return self.reject(f"worker {inp.worker_id} does not hold this attempt")
        # Should the worker come back, it must not keep running the attempt.
        self._stop_order(run, "declared lost")
        start = self._not_before(run)
        if run.state == "dispatched" and start is not None and start > self.at:
            # It cannot have started: a worker starts nothing before the attempt's start
            # time, and its lease (which fences its runs) ended before this verdict. So
            # the attempt is given back, as by the worker itself: no retry is consumed.
            self._give_back(
                run, f"worker {inp.worker_id} lost before the run's start: dispatched again"
            )
            return None
        # Whether a lost attempt did its work is unknown: only idempotent jobs run again.
        self._fail_attempt(
            run, f"lost: worker {inp.worker_id}", retry_allowed=self.job.spec.idempotent
        )

    def released(self, inp: RunReleased) -> None:
        """The holder of an attempt it never started gives it back: dispatch it again."""
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if self._unsealed(inp, "release"):
            return None
        if run.worker_id != inp.worker_id or run.state != "dispatched":
            return self.reject(
                f"release by {inp.worker_id} while {run.state} on {run.worker_id or 'nobody'}"
            )
        why = f": {inp.reason}" if inp.reason else ": dispatched again"
        self._give_back(run, f"released by worker {inp.worker_id}{why}")
        return None

    def _give_back(self, run: RunState, reason: str) -> None:
        """A claimed attempt that never started goes back to `due`, the same attempt (no
        retry is consumed), unclaimed, with a fresh claim deadline and a new dispatch
        request that keeps its start time (as the claim deadline's re-dispatch does)."""
        if run.cancelling:
            return self._settle_cancel(run)
        start = self._not_before(run)
        not_before = self.at if start is None else max(start, self.at)
        self._due(run, run.attempt, not_before, reason)

    def deadline(self, inp: DeadlineReached) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.deadline_kind != inp.kind or run.deadline_ms is None:
            return self.reject(f"no {inp.kind} deadline pending ({run.state})")
        if self.at < run.deadline_ms:
            return self.reject("deadline not reached yet")
        if inp.kind == "claim":
            # Dispatch is at-least-once: nobody claimed in time, so place it again.
            deadline = self.at + self.config.claim_timeout_ms
            again = replace(run, deadline_ms=deadline, updated_ms=self.at)
            self.runs[run.run_id] = again
            self._dispatch(again, self.at)
        elif inp.kind == "retry":
            self._due(run, run.attempt + 1, self.at, f"retry {run.attempt + 1}")
        elif inp.kind == "dependency":
            self._move(run, "skipped", "upstreams did not all succeed in time")
        else:
            self._stop_order(run, "no report before the timeout backstop")
            self._fail_attempt(
                run, "timeout: no report from the worker", retry_allowed=self.job.spec.idempotent
            )

    def _fail_attempt(
        self, run: RunState, reason: str, *, retry_allowed: bool, exit_code: int | None = None
    ) -> None:
        if run.cancelling:
            return self._settle_cancel(run, MAY_HAVE_STARTED, exit_code=exit_code)
        retry = self.job.spec.retry
        if retry_allowed and run.attempt < retry.max_attempts:
            backoff_s = min(
                retry.backoff_s * retry.backoff_multiplier ** (run.attempt - 1),
                retry.max_backoff_s,
            )
            # Up to 10% jitter, stable per (run, attempt), so retries of many runs that
            # failed together do not return together.
            jitter = jitter_ms(f"{run.run_id}#{run.attempt}", run.scheduled_ms, backoff_s * 0.1)
            due = self.at + int(backoff_s * 1000) + jitter
            self._move(run, "retrying", reason, deadline=(due, "retry"), exit_code=exit_code)
        else:
            self._move(run, "failed", reason, exit_code=exit_code)
