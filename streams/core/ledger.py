"""The ledger: a deterministic state machine over one job's log (design.md section 4).

`decide(job, runs, input, config)` returns what the input changes: the new job state,
changed runs, run-events, dispatch requests and the runs to forget. It is pure: time
comes from `input.at_ms`, ids are derived from the log, and nothing here knows Kafka.
The process in streams/ledger_process.py feeds it from `job-log` inside Kafka
transactions and writes the decision back atomically.

The rules, in short:
- one run per (job, scheduled time): a fire proposal at or below the job's `fired_ms`
  watermark, or whose run exists, changes nothing;
- proposals that arrive late (a takeover after a crash) follow the job's misfire policy
  inside a bounded catch-up window;
- a run moves forward only: stale attempts, claims by another worker, reports for a
  state the run has left, and premature deadlines are rejected with a reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.records import (
    BackfillRequested,
    CancelRequested,
    ClaimRequested,
    DeadlineKind,
    DeadlineReached,
    DispatchRequest,
    FireProposed,
    JobDeleted,
    JobEvent,
    JobPaused,
    JobResumed,
    JobState,
    JobUpserted,
    LedgerInput,
    RerunRequested,
    RunEvent,
    RunFinished,
    RunNowRequested,
    RunStarted,
    RunState,
    RunStateName,
    Trigger,
    WorkerLost,
)
from streams.core.schedule import fires_between, jitter_ms, next_fire
from streams.core.spec import JobSpec


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
    keep_request_ids: int = 1000


@dataclass(frozen=True, slots=True)
class Decision:
    job: JobState | None = None  # the new job state, when it changed
    runs: tuple[RunState, ...] = ()  # changed runs
    forget: tuple[str, ...] = ()  # run ids to drop from the run table (tombstones)
    events: tuple[RunEvent | JobEvent, ...] = ()
    dispatch: tuple[DispatchRequest, ...] = ()
    rejected: str = ""  # why the input changed nothing, for logs and metrics

    @property
    def changed(self) -> bool:
        return self.job is not None or bool(self.runs or self.forget)


RunLookup = Callable[[str], RunState | None]


def decide(
    job: JobState | None, runs: RunLookup, inp: LedgerInput, config: LedgerConfig = LedgerConfig()
) -> Decision:
    if isinstance(inp, JobUpserted):
        return _upsert(job, inp)
    if job is None:
        return Decision(rejected=f"unknown job {_job_id(inp)}")
    builder = _Builder(job, runs, inp.at_ms, config)
    match inp:
        case JobPaused() | JobResumed() | JobDeleted():
            builder.job_flag(inp)
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
        case BackfillRequested():
            builder.backfill(inp)
    return builder.decision()


def _job_id(inp: LedgerInput) -> str:
    return inp.spec.job_id if isinstance(inp, JobUpserted) else inp.job_id


def _next_due(spec: JobSpec, after_ms: int) -> int | None:
    return next_fire(spec.schedule, after_ms, spec.dst)


def _upsert(job: JobState | None, inp: JobUpserted) -> Decision:
    spec, at = inp.spec, inp.at_ms
    if job is None or job.deleted:
        # Only times after registration are due (a re-created job starts afresh, but
        # never below the old watermark: those times were decided once already).
        fired = at if job is None else max(job.fired_ms, at)
        new = JobState(
            spec=spec,
            paused=False,
            deleted=False,
            created_ms=at,
            updated_ms=at,
            fired_ms=fired,
            next_due_ms=_next_due(spec, fired),
            live_runs=(),
            final_runs=() if job is None else job.final_runs,
            recent_requests=() if job is None else job.recent_requests,
            version=1 if job is None else job.version + 1,
        )
    else:
        fired = job.fired_ms
        if spec.schedule != job.spec.schedule or spec.dst != job.spec.dst:
            # A new schedule applies from now on, never retroactively.
            fired = max(fired, at)
        new = replace(
            job,
            spec=spec,
            updated_ms=at,
            fired_ms=fired,
            next_due_ms=None if job.paused else _next_due(spec, fired),
            version=job.version + 1,
        )
    event = JobEvent(f"{spec.job_id}#job#{new.version}", spec.job_id, "upserted", at, spec)
    return Decision(job=new, events=(event,))


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
        self.rejected = ""

    # -- plumbing ---------------------------------------------------------------------
    def decision(self) -> Decision:
        return Decision(
            job=self.job if self.changed_job else None,
            runs=tuple(self.runs.values()),
            forget=tuple(self.forget),
            events=tuple(self.events),
            dispatch=tuple(self.dispatch),
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
        attempt = run.attempt if attempt is None else attempt
        worker = run.worker_id if worker_id is None else worker_id
        final = state in ("succeeded", "failed", "cancelled", "skipped")
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

    def _create(self, scheduled: int, trigger: Trigger, run_id: str, request_id: str = "") -> None:
        spec = self.job.spec
        not_before = max(scheduled + jitter_ms(spec.job_id, scheduled, spec.jitter_s), self.at)
        run = RunState(
            run_id=run_id,
            job_id=spec.job_id,
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
        )
        self.set_job(live_runs=(*self.job.live_runs, run_id))
        self._due(run, 1, not_before, "")

    def _due(self, run: RunState, attempt: int, not_before: int, reason: str) -> None:
        """Make (run, attempt) due and ask the dispatcher to place it."""
        deadline = max(self.at, not_before) + self.config.claim_timeout_ms
        moved = self._move(
            run, "due", reason, attempt=attempt, worker_id="", deadline=(deadline, "claim")
        )
        self._dispatch(moved, not_before)

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
        run = RunState(
            run_id=run_id,
            job_id=self.job.spec.job_id,
            scheduled_ms=scheduled,
            trigger=trigger,
            state="skipped",
            attempt=1,
            worker_id="",
            created_ms=self.at,
            updated_ms=self.at,
            deadline_ms=None,
            deadline_kind=None,
            started_ms=None,
            finished_ms=None,
            exit_code=None,
            reason=reason,
            seq=-1,
        )
        self.set_job(live_runs=(*self.job.live_runs, run_id))
        self._move(run, "skipped", reason)

    # -- job flags --------------------------------------------------------------------
    def job_flag(self, inp: JobPaused | JobResumed | JobDeleted) -> None:
        job = self.job
        if job.deleted:
            return self.reject(f"job {job.spec.job_id} is deleted")
        if isinstance(inp, JobPaused):
            if job.paused:
                return self.reject("already paused")
            self.set_job(paused=True, next_due_ms=None)
            kind = "paused"
        elif isinstance(inp, JobResumed):
            if not job.paused:
                return self.reject("not paused")
            # Firings during the pause are not due: the watermark moves to now.
            fired = max(job.fired_ms, self.at)
            self.set_job(paused=False, fired_ms=fired, next_due_ms=_next_due(job.spec, fired))
            kind = "resumed"
        else:
            for run_id in job.live_runs:
                run = self.run(run_id)
                if run is not None and run.state in ("waiting", "due", "retrying"):
                    self._move(run, "cancelled", "job deleted")
            self.set_job(deleted=True, next_due_ms=None)
            kind = "deleted"
        self.set_job(version=self.job.version + 1)
        self.events.append(
            JobEvent(
                f"{job.spec.job_id}#job#{self.job.version}",
                job.spec.job_id,
                kind,  # type: ignore[arg-type]
                self.at,
                None,
            )
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
        if next_fire(spec.schedule, inp.scheduled_ms - 1, spec.dst) != inp.scheduled_ms:
            return self.reject("not a fire time of the schedule")
        # Everything undecided up to the proposal, or up to now when it comes late.
        latest_due = max(inp.scheduled_ms, self._last_fire_at_or_before(self.at))
        floor = max(job.fired_ms, self.at - cfg.catchup_window_ms)
        times = fires_between(
            spec.schedule, floor, latest_due, spec.dst, limit=cfg.max_catchup_runs + 1
        )
        if len(times) > cfg.max_catchup_runs:
            times = times[-cfg.max_catchup_runs :]
        late = [t for t in times if self.at - t > cfg.misfire_grace_ms]
        timely = [t for t in times if self.at - t <= cfg.misfire_grace_ms]
        run_late: set[int] = set()
        if spec.misfire == "run_all":
            run_late = set(late)
        elif spec.misfire == "run_once" and late and not timely:
            run_late = {late[-1]}
        for t in times:
            if t in run_late or t in timely:
                self._fire_one(t)
            else:
                self._skip(t, "schedule", f"misfire ({spec.misfire})")
        self.set_job(fired_ms=latest_due, next_due_ms=_next_due(spec, latest_due))

    def _last_fire_at_or_before(self, t: int) -> int:
        """The newest fire time <= t, or the watermark when there is none after it."""
        spec = self.job.spec
        window_start = max(self.job.fired_ms, t - self.config.catchup_window_ms)
        times = fires_between(spec.schedule, window_start, t, spec.dst, limit=1_000_000)
        return times[-1] if times else self.job.fired_ms

    def _fire_one(self, scheduled: int) -> None:
        spec = self.job.spec
        run_id = scheduled_run_id(spec.job_id, scheduled)
        if self.run(run_id) is not None:
            return
        live = [r for r in (self.run(x) for x in self.job.live_runs) if r and not r.final]
        if live and spec.concurrency == "forbid":
            return self._skip(scheduled, "schedule", f"concurrency forbid: {live[0].run_id} live")
        if live and spec.concurrency == "replace":
            for old in live:
                self._move(old, "cancelled", f"replaced by {run_id}")
        self._create(scheduled, "schedule", run_id)

    def run_now(self, inp: RunNowRequested) -> None:
        if self.job.deleted:
            return self.reject("job is deleted")
        run_id = manual_run_id(self.job.spec.job_id, inp.request_id)
        if inp.request_id in self.job.recent_requests or self.run(run_id) is not None:
            return self.reject("duplicate request")
        self._remember(inp.request_id)
        self._create(self.at, "manual", run_id, inp.request_id)

    def backfill(self, inp: BackfillRequested) -> None:
        # Backfill runs only times the ledger never decided: before the job existed.
        spec, cfg = self.job.spec, self.config
        if self.job.deleted:
            return self.reject("job is deleted")
        upper = min(inp.to_ms, self.job.created_ms)
        times = fires_between(
            spec.schedule, inp.from_ms - 1, upper, spec.dst, limit=cfg.max_catchup_runs
        )
        fresh = [t for t in times if self.run(scheduled_run_id(spec.job_id, t)) is None]
        if not fresh:
            return self.reject("nothing to backfill before the job's registration")
        for t in fresh:
            self._create(t, "backfill", scheduled_run_id(spec.job_id, t))

    def rerun(self, inp: RerunRequested) -> None:
        run = self.run(inp.run_id)
        if inp.request_id in self.job.recent_requests:
            return self.reject("duplicate request")
        if run is None:
            return self.reject(f"unknown or forgotten run {inp.run_id}")
        if not run.final:
            return self.reject(f"run {inp.run_id} is still {run.state}")
        self._remember(inp.request_id)
        self.set_job(
            live_runs=(*self.job.live_runs, run.run_id),
            final_runs=tuple(r for r in self.job.final_runs if r != run.run_id),
        )
        self._due(run, run.attempt + 1, self.at, f"rerun {inp.request_id}")

    def _remember(self, request_id: str) -> None:
        keep = self.config.keep_request_ids
        self.set_job(recent_requests=(*self.job.recent_requests, request_id)[-keep:])

    def cancel(self, inp: CancelRequested) -> None:
        run = self.run(inp.run_id)
        if run is None or run.final:
            return self.reject("run is not live")
        self._move(run, "cancelled", "cancelled by request")

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

    def claim(self, inp: ClaimRequested) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.state != "due":
            return self.reject(f"already claimed by {run.worker_id or 'nobody'} ({run.state})")
        backstop = self._timeout_backstop(max(self.at, run.scheduled_ms))
        self._move(run, "dispatched", "", worker_id=inp.worker_id, deadline=(backstop, "timeout"))

    def started(self, inp: RunStarted) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.worker_id != inp.worker_id or run.state != "dispatched":
            return self.reject(f"start by {inp.worker_id} while {run.state} on {run.worker_id}")
        self._move(run, "running", deadline=(self._timeout_backstop(self.at), "timeout"))

    def _timeout_backstop(self, start: int) -> int:
        return start + int(self.job.spec.timeout_s * 1000) + self.config.timeout_grace_ms

    def finished(self, inp: RunFinished) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.worker_id != inp.worker_id or run.state not in ("dispatched", "running"):
            return self.reject(f"report by {inp.worker_id} while {run.state} on {run.worker_id}")
        if inp.exit_code == 0:
            self._move(run, "succeeded", exit_code=0)
            return None
        reason = inp.error or (
            f"exit code {inp.exit_code}" if inp.exit_code is not None else "killed"
        )
        self._fail_attempt(run, reason, retry_allowed=True, exit_code=inp.exit_code)

    def lost(self, inp: WorkerLost) -> None:
        run = self._current(inp.run_id, inp.attempt)
        if run is None:
            return None
        if run.worker_id != inp.worker_id or run.state not in ("dispatched", "running"):
            return self.reject(f"worker {inp.worker_id} does not hold this attempt")
        # Whether a lost attempt did its work is unknown: only idempotent jobs run again.
        self._fail_attempt(
            run, f"lost: worker {inp.worker_id}", retry_allowed=self.job.spec.idempotent
        )

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
        else:
            self._fail_attempt(
                run, "timeout: no report from the worker", retry_allowed=self.job.spec.idempotent
            )

    def _fail_attempt(
        self, run: RunState, reason: str, *, retry_allowed: bool, exit_code: int | None = None
    ) -> None:
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
