"""The shared kernel of a decision: one input's changes accumulated (`Kernel`), runs moved
through their states by `_move`, created, made due and dispatched. The concerns built on it
(firing, dependencies, attempts) change state only through these methods.
"""

from __future__ import annotations

from dataclasses import replace

from schemas.records import (
    FINAL_STATES,
    TRANSITIONS,
    BackfillRequested,
    CancelOrder,
    ClaimReply,
    DeadlineKind,
    DependencyLinked,
    DispatchRequest,
    JobEvent,
    JobState,
    RunEvent,
    RunState,
    RunStateName,
    Trigger,
    UpstreamFinished,
)
from schemas.spec import JobSpec
from streams.core.ids import parse_run_id, scheduled_run_id
from streams.core.ledger.decision import (
    WITHDRAWN,
    Decision,
    LedgerConfig,
    RunLookup,
)
from streams.core.params import ParamError, ParamValues, resolve, written
from streams.core.schedule import jitter_ms, next_fire


def due_after(spec: JobSpec, after_ms: int) -> int | None:
    return next_fire(spec.schedule, after_ms, spec.dst)


def dependency_links(
    job_id: str, owner: str, before: tuple[str, ...], after: tuple[str, ...], at: int
) -> tuple[DependencyLinked, ...]:
    """Tell each upstream added or removed that `job_id` (of `owner`) depends on it (or
    no longer)."""
    added = [DependencyLinked(u, job_id, True, at, owner) for u in after if u not in before]
    removed = [DependencyLinked(u, job_id, False, at, owner) for u in before if u not in after]
    return tuple(added + removed)


def _ahead(run_id: str, undecided: int) -> bool:
    """Whether a run's scheduled time, read from its id, is after `undecided`: only such
    a final run can be a withdrawn firing to keep, so the others are never looked up
    (retiring a run is on every run's path)."""
    parts = parse_run_id(run_id)
    return parts is not None and parts.scheduled_ms is not None and parts.scheduled_ms > undecided


def withdrawn(run: RunState | None) -> bool:
    """A firing withdrawn ahead of its time by a pause, delete or change: it never ran, and
    a resume, re-creation or change back may revive it (`Kernel._revive`)."""
    return run is not None and run.state == "cancelled" and run.reason in WITHDRAWN


class Kernel:
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
        self.notices: list[DependencyLinked | UpstreamFinished | BackfillRequested] = []
        self.replies: list[ClaimReply | CancelOrder] = []
        self.rejected = ""
        self.dead_letter = False  # the rejected input goes to the dead letters (bad values)
        # A withdrawal in this decision moves the watermark back to its time, after it
        # withdrew (see `_retire`).
        self.withdrawn_after = at

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
            dead_letter=self.dead_letter,
        )

    def reject(self, reason: str, dead_letter: bool = False) -> None:
        self.rejected = reason
        self.dead_letter = dead_letter

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
        reported_ms: int | None = None,
    ) -> RunState:
        """Record one transition: new run state, its event, and the job's run lists.
        `reported_ms`: when the worker whose report decides it says it happened, already
        clamped (`_vouched`); the run's start or finish time, else the ledger's now."""
        before = None if run.seq <= 0 else run.state
        if state not in TRANSITIONS[before]:  # a bug in this module, never an input's fault
            raise AssertionError(f"{run.run_id}: {before} -> {state} is not a legal transition")
        attempt = run.attempt if attempt is None else attempt
        worker = run.worker_id if worker_id is None else worker_id
        final = state in FINAL_STATES
        happened = self.at if reported_ms is None else reported_ms
        moved = replace(
            run,
            state=state,
            attempt=attempt,
            worker_id=worker,
            updated_ms=self.at,
            deadline_ms=None if deadline is None else deadline[0],
            deadline_kind=None if deadline is None else deadline[1],
            started_ms=happened if state == "running" else run.started_ms,
            finished_ms=happened if final else run.finished_ms,
            exit_code=exit_code if exit_code is not None else run.exit_code,
            reason=reason,
            seq=run.seq + 1,
            cancelling="",  # a transition settles a pending cancel (see `_cancel_run`)
            asked_ms=None,  # and the backstop's question (see `Attempts.deadline`)
        )
        self.runs[run.run_id] = moved
        if state == "cancelled" and reason in WITHDRAWN and run.trigger == "schedule":
            # A withdrawal confirmed (the run never started): not one of the schedule's
            # runs for max_runs, unless it is fired after all (`_fire_one` counts it then).
            self.set_job(schedule_runs=max(0, self.job.schedule_runs - 1))
            job = self.job
            if job.next_due_ms is None and not (job.paused or job.deleted):
                # The schedule had stopped at max_runs: it fires again after all.
                self.set_job(next_due_ms=due_after(job.spec, job.fired_ms))
        self.events.append(
            RunEvent(
                event_id=f"{run.run_id}#{moved.seq}",
                params=run.params if run.seq == 0 else (),
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
                reported_ms=reported_ms,
            )
        )
        if final:
            self._retire(run.run_id)
            # A withdrawn firing tells its dependents nothing: it may be revived, and its
            # time, never reported, joins a dependent's next period as any time not run.
            if run.trigger != "manual" and self.job.dependents and not withdrawn(moved):
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
        """A run is final: the oldest final runs beyond `keep_final_runs` are forgotten,
        except the runs of times not decided again yet (still to come, or above the
        watermark, which a change or pause moved back), which a resume, a re-creation,
        a change back or a late proposal decides: forgotten, they would be created again
        under the same run id and event ids. Most are firings withdrawn ahead (revived
        then); one whose withdrawal its holder answered by starting it is the one run
        of its time all the same. There are no more of those than runs decided ahead,
        and they become forgettable once decided (the watermark passed them)."""
        keep = self.config.keep_final_runs
        # Times after this are to be decided again (by a late proposal, a resume): the
        # watermark went back below them, or they are still to come.
        undecided = min(self.at, self.job.fired_ms, self.withdrawn_after)
        live = tuple(r for r in self.job.live_runs if r != run_id)
        finals = (*self.job.final_runs, run_id)
        excess = len(finals) - keep
        if excess > 0:
            gone: list[str] = []
            for old in finals:
                if len(gone) == excess:
                    break
                if _ahead(old, undecided):
                    continue
                gone.append(old)
            self.forget.extend(gone)
            for old in gone:
                self.runs.pop(old, None)
            self._forgotten(gone)
            dropped = set(gone)
            finals = tuple(r for r in finals if r not in dropped)
        self.set_job(live_runs=live, final_runs=finals)

    def _forgotten(self, run_ids: list[str]) -> None:
        """Runs forgotten: their times are decided for good (`JobState.forgotten_ms`)."""
        times = [
            parts.scheduled_ms
            for parts in map(parse_run_id, run_ids)
            if parts is not None and parts.scheduled_ms is not None
        ]
        if times and max(times) > self.job.forgotten_ms:
            self.set_job(forgotten_ms=max(times))

    def _create(
        self,
        scheduled: int,
        trigger: Trigger,
        run_id: str,
        request_id: str = "",
        period_start: int | None = None,
        given: ParamValues = (),
    ) -> None:
        """A new run: `due` at once, or `waiting` on upstreams for (period_start, scheduled].
        Its parameter values are the `given` ones over the job's defaults; a parameter
        without a default that none gave skips it, naming the parameter."""
        spec = self.job.spec
        run = self._fresh_run(run_id, scheduled, trigger, request_id, period_start)
        self.set_job(live_runs=(*self.job.live_runs, run_id))
        if spec.params or given:
            try:
                run = replace(run, params=resolve(spec.params, given))
            except ParamError as exc:
                # Recorded as a skip at creation (seq 0), like every firing decided not
                # to run (`_skip`).
                self._move(replace(run, seq=-1), "skipped", f"{exc}: give it to run-now")
                return
        if spec.depends_on and period_start is not None:
            wait = scheduled + self.config.dependency_wait_ms
            self._evaluate(self._move(run, "waiting", deadline=(wait, "dependency")))
        else:
            self._make_due(run, "")

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

    def _make_due(self, run: RunState, reason: str) -> None:
        """Make a new, waiting or revived run due at its scheduled time plus its jitter."""
        spec = self.job.spec
        not_before = max(
            run.scheduled_ms + jitter_ms(spec.job_id, run.scheduled_ms, spec.jitter_s), self.at
        )
        self._due(run, run.attempt, not_before, reason)

    def _due(self, run: RunState, attempt: int, not_before: int, reason: str) -> None:
        """Make (run, attempt) due and ask the dispatcher to place it, to start no
        earlier than `not_before` (kept in the run state: see `_not_before`)."""
        deadline = max(self.at, not_before) + self.config.claim_timeout_ms
        moved = self._move(
            run, "due", reason, attempt=attempt, worker_id="", deadline=(deadline, "claim")
        )
        moved = self.runs[run.run_id] = replace(moved, not_before_ms=not_before)
        self._dispatch(moved, not_before)

    def values(self, run: RunState) -> ParamValues:
        """A run's parameter values under the job's declaration in force now: its own
        values of the parameters still declared, the defaults of the others. Raises
        ParamError when a parameter declared since has no default (or a kept value no
        longer has the declared type)."""
        declared = self.job.spec.params
        if not declared:
            return ()
        names = {p.name for p in declared}
        return resolve(declared, tuple((n, v) for n, v in run.params if n in names))

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
        """Ask the dispatcher to place a due run, with its parameter values under the
        declaration in force now (`values`)."""
        try:
            values = self.values(run)
        except ParamError as exc:
            # A parameter declared without a default after the run was made: the run
            # has no value for it, so it must not start (with `{name}` left in its argv).
            self._move(run, "failed", f"{exc}, and the run was made without it")
            return
        if values != run.params:
            run = self.runs[run.run_id] = replace(run, params=values)
        spec = self.job.spec
        try:
            # The values reach the process in its environment, and its argv: every limit
            # is checked on that, as written (a default can make it megabytes).
            command, env = written(spec, run.params)
        except ParamError as exc:
            self._move(run, "failed", str(exc))
            return
        self.dispatch.append(
            DispatchRequest(
                run_id=run.run_id,
                job_id=run.job_id,
                attempt=run.attempt,
                owner=spec.owner,
                command=command,
                env=env,
                secret_env=spec.secret_env,
                resources=spec.resources,
                timeout_s=spec.timeout_s,
                priority=spec.priority,
                scheduled_ms=run.scheduled_ms,
                not_before_ms=not_before,
                at_ms=self.at,
            )
        )

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
            self._make_due(revived, "revived: due again")

    def _skip(self, scheduled: int, trigger: Trigger, reason: str) -> None:
        """A firing decided not to run: recorded as a run that is at once `skipped`."""
        run_id = scheduled_run_id(self.job.spec.job_id, scheduled)
        run = replace(self._fresh_run(run_id, scheduled, trigger), seq=-1)
        self.set_job(live_runs=(*self.job.live_runs, run_id))
        self._move(run, "skipped", reason)

    def _job_event(self, kind: str, at: int, spec: JobSpec | None = None) -> None:
        job_id = self.job.spec.job_id
        self.events.append(
            JobEvent(f"{job_id}#job#{self.job.version}", job_id, kind, at, spec)  # type: ignore[arg-type]
        )

    def _cancel_run(self, run: RunState, reason: str) -> None:
        """Cancel a live run. A claimed attempt not reported started may start before the
        stop order reaches its worker (the order travels through worker-inbox, the start
        is the worker's own timer): were it cancelled now, that execution would be one the
        record denies, and a revived firing could run beside it. So it stays `dispatched`
        with the cancel pending, and the holder's answer settles it: released (or
        asking for the claim again, or declared dead) -> cancelled; started -> running,
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
        self,
        run: RunState,
        started: str = "",
        exit_code: int | None = None,
        reported_ms: int | None = None,
    ) -> None:
        """The holder of an attempt with a cancel pending answered, or was declared dead:
        the run is cancelled. Released unstarted, it keeps the cancel's own reason (a
        withdrawn firing is known by it, and may be revived); if it started, or may have
        (`started` says which), the reason says so and the firing is never revived."""
        reason = f"{run.cancelling} ({started})" if started else run.cancelling
        self._move(run, "cancelled", reason, exit_code=exit_code, reported_ms=reported_ms)

    def _vouched(self, reported_ms: int, earliest: int) -> int:
        """A worker's stamp for what it reports, within what the ledger can vouch for:
        not before `earliest` (nothing starts before its grant and start time, nothing
        ends before its start) nor after now (the ledger has recorded it). A worker's
        clock, however skewed, moves a run's history only inside that window."""
        return min(max(reported_ms, min(earliest, self.at)), self.at)

    def _stop_order(self, run: RunState, reason: str) -> None:
        """Tell the worker holding (run, attempt) to stop it, if one holds it."""
        if run.worker_id and run.state in ("dispatched", "running"):
            self.replies.append(
                CancelOrder(run.worker_id, run.run_id, run.attempt, reason, self.at)
            )

    def _evaluate(self, run: RunState) -> None:
        """Gate a new run on its upstreams: the dependencies' (`Dependencies._evaluate`)."""
        raise NotImplementedError

    def _dag_steps(self) -> None:
        """Decide a step's periods: the dependencies' (`Dependencies._dag_steps`)."""
        raise NotImplementedError
