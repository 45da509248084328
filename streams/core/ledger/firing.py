"""Job changes and firings: registration changes, pause, resume and delete, fire proposals
with their misfire policy and catch-up window, run-now, backfill and rerun requests.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import lru_cache

from schemas.records import (
    BackfillRequested,
    DependencyLinked,
    FireProposed,
    JobDeleted,
    JobPaused,
    JobResumed,
    JobUpserted,
    PendingBackfill,
    RecentRequest,
    RerunRequested,
    RunNowRequested,
    Span,
)
from schemas.spec import AtSchedule, JobSpec
from streams.core.calendar import excluded_by, skip_reason
from streams.core.ids import manual_run_id, parse_run_id, scheduled_run_id
from streams.core.ledger.decision import (
    WITHDRAWN,
    WITHDRAWN_BY_CHANGE,
    WITHDRAWN_BY_DELETE,
    WITHDRAWN_BY_PAUSE,
)
from streams.core.ledger.kernel import Kernel, dependency_links, due_after, withdrawn
from streams.core.params import ParamError, resolve, written
from streams.core.schedule import fires_between, newest_fires, next_fire


@lru_cache(maxsize=65_536)
def _scheduled_ms(run_id: str) -> int | None:
    """The scheduled time a run id names (None: a manual run's id)."""
    parts = parse_run_id(run_id)
    return None if parts is None else parts.scheduled_ms


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


class Firing(Kernel):
    """What a job's owner and the scheduler ask of the ledger."""

    def respec(self, inp: JobUpserted, at: int) -> None:
        """A registered job's spec changes at `at`: the old schedule's firings up to `at`
        are decided first, then the new schedule applies from `at` exactly, and runs
        created ahead for times after `at` that the new schedule does not have are
        withdrawn."""
        spec, old = inp.spec, self.job.spec
        retimed = spec.schedule != old.schedule or spec.dst != old.dst
        # Runs created ahead under `allow` were never judged by `forbid`/`replace`: a
        # switch to either withdraws them all, to be decided again at their time.
        # (A step has none: it decides each period when its upstreams report it, and
        # its watermark must stay, or the periods not yet reported are lost.)
        exclusive = (
            spec.concurrency != "allow"
            and spec.concurrency != old.concurrency
            and (spec.schedule is not None or old.schedule is not None)
        )
        # Runs created ahead were gated by the upstreams of their decision: a change of
        # `depends_on` withdraws them too, to be gated at their time by the new ones (a
        # step, without a schedule, decides its periods as its upstreams report them).
        regated = spec.depends_on != old.depends_on and spec.schedule is not None
        # Any change applies from its own time: the firings due before it are decided
        # under the spec they were due by (a lower max_runs, a new calendar or parameter
        # must not swallow one that no proposal has decided yet).
        self._decide_until(at)
        if retimed or exclusive or regated:
            kept = spec  # the new schedule's own times stay: the change keeps those firings
            self._withdraw(
                at,
                WITHDRAWN_BY_CHANGE,
                keep=lambda t: (
                    not exclusive and not regated and next_fire(kept.schedule, t - 1, kept.dst) == t
                ),
            )
        retimed = retimed or exclusive or regated
        job = self.job
        # The new schedule fires from `at`, never below a firing whose run was forgotten
        # (decided for good: deciding it again would make its run twice).
        fired = max(at, job.forgotten_ms) if retimed else job.fired_ms
        once = spec.schedule.at_ms - 1 if isinstance(spec.schedule, AtSchedule) else None
        if retimed and once is not None and once < at and self._undecided(once + 1, old, at):
            # A one-off moved to a time already past: proposed at once, as when registered
            # so, to run or be recorded as skipped by its misfire policy (a run already
            # made for that time stays the one run of it, and a withdrawn one is revived).
            fired = once
            if once < job.created_ms:  # decided by the schedule, not left to a backfill
                self.set_job(created_ms=once)
        links = dependency_links(spec.job_id, spec.owner, old.depends_on, spec.depends_on, at)
        self.notices.extend(links)
        if job.cycle:
            # The refused change is changed: its upstreams are probed again (each link
            # just added is a probe of its own).
            linked = {n.job_id for n in links}
            self.notices.extend(
                DependencyLinked(u, spec.job_id, True, at, spec.owner, (spec.job_id,))
                for u in spec.depends_on
                if u not in linked
            )
        self.set_job(
            spec=spec,
            cycle=(),
            fired_ms=fired,
            next_due_ms=None if job.paused else due_after(spec, fired),
            version=job.version + 1,
        )
        self._job_event("upserted", at, spec)
        if spec.depends_on != old.depends_on:
            self._regate()
        self._step_due()

    def _step_due(self) -> None:
        """A step is due at the end of its first open period's wait, not by a schedule:
        decided again by the upstreams now in effect (after a change or a resume)."""
        spec = self.job.spec
        if spec.schedule is None and spec.depends_on and not self.job.paused:
            self._dag_steps()

    def _regate(self) -> None:
        """The runs still waiting for earlier times, judged again by the upstreams now in
        effect: one removed no longer holds them (nor can its outcome reach them: its
        notices are refused), one added gates them too."""
        for run_id in self.job.live_runs:
            run = self.run(run_id)
            if run is not None and run.state == "waiting":
                self._evaluate(run)

    def _undecided(self, t: int, old: JobSpec, at: int) -> bool:
        """Whether a firing at `t`, before the change at `at`, is to be decided (again):
        its run is a withdrawn firing (revived), or no run is known and `t` is above what
        the job decided. Decided, with no run known, `t` may have had a run that was
        forgotten since: deciding it again could run it twice, so a one-off moved there
        is not run; a run known and not withdrawn is the one run of `t` already (and the
        watermark must not go back below it: it could be forgotten, then created
        again)."""
        run = self.run(scheduled_run_id(self.job.spec.job_id, t))
        if run is not None:
            return withdrawn(run)  # revived; any other run of `t` decided it already
        decided = self.job.fired_ms
        if decided > at:
            # Decided ahead (and withdrawn by this change: those runs are known): below
            # `at` the old schedule decided up to its newest time at or before it.
            window = at - self.config.catchup_window_ms
            times = newest_fires(old.schedule, window, at, old.dst, 1)
            decided = times[-1] if times else window
        return t > max(decided, self.job.forgotten_ms)

    def _decide_until(self, at: int) -> None:
        """Decide the schedule's firings up to `at` that no proposal has decided yet: a
        change at `at` must not swallow a firing that was due before it."""
        job = self.job
        if job.paused or job.deleted:
            return
        upcoming = due_after(job.spec, job.fired_ms)
        if upcoming is not None and upcoming <= at:
            self._decide_up_to(self._last_fire_at_or_before(at))

    def _withdraw(
        self, after: int, reason: str, keep: Callable[[int], bool] = lambda _: False
    ) -> None:
        """Cancel the scheduled runs for times after `after` that were created ahead and
        cannot have started (waiting, due, or claimed with a start time still to come).
        A firing withdrawn so may be revived (see `_fire_one`) if the job fires it
        after all: a resume, a re-creation or another change before its time."""
        self.withdrawn_after = min(self.withdrawn_after, after)
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
                # Its count of max_runs is given back once the withdrawal is confirmed
                # (see `Kernel._move`), not while the holder may still start it.
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
            self.set_job(paused=False)
            if inp.missed != "skip":
                self._run_missed(at, inp.missed == "last")
            # The other firings during the pause are not due: the watermark moves to the
            # resume.
            fired = max(self.job.fired_ms, at)
            self.set_job(fired_ms=fired, next_due_ms=due_after(job.spec, fired))
            self._step_due()
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
                dependency_links(job.spec.job_id, job.spec.owner, job.spec.depends_on, (), at)
            )
            self._compact_deleted(at)
            kind = "deleted"
        self.set_job(version=self.job.version + 1)
        self._job_event(kind, at)
        return None

    def _run_missed(self, at: int, last_only: bool) -> None:
        """On a resume that asks for them: the firings the pause covered, the newest
        only or every one within the catch-up window, decided now (late, whatever the
        misfire policy: the operator asked for them)."""
        spec, cfg = self.job.spec, self.config
        floor = max(self.job.fired_ms, at - cfg.catchup_window_ms)
        count = 1 if last_only else cfg.max_catchup_runs
        previous = self.job.fired_ms
        for t in newest_fires(spec.schedule, floor, at, spec.dst, count):
            if spec.max_runs is not None and self.job.schedule_runs >= spec.max_runs:
                break
            self._fire_one(t, previous)
            previous = t

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
            and not withdrawn(run)
            and run.cancelling not in WITHDRAWN  # withdrawn once its holder answers
        ]
        return min(self.job.fired_ms, max([at, self.job.forgotten_ms, *kept]))

    def _compact_deleted(self, at: int) -> None:
        """A deleted job keeps a small stub, not a tombstone: its version (event ids stay
        unique if it is re-created), watermark, first registration time, backfilled
        spans, request memory, dependents and the probes it passed (a probe id is never
        given twice). Its final runs are forgotten, except the
        firings withdrawn ahead of their time, which a re-creation may revive."""
        fired = self._fired_back_to(at)  # before forgetting: it reads the final runs
        keep: list[str] = []
        gone: list[str] = []
        for run_id in self.job.final_runs:
            run = self.run(run_id)
            if run is not None and run.trigger != "manual" and run.scheduled_ms > at:
                # A re-creation fires from its own time, after the deletion's: it revives
                # a withdrawn firing, and finds any other run the one run of its time.
                keep.append(run_id)
            else:
                self.forget.append(run_id)
                self.runs.pop(run_id, None)
                gone.append(run_id)
        self._forgotten(gone)
        self.set_job(
            deleted=True,
            next_due_ms=None,
            fired_ms=fired,
            final_runs=tuple(keep),
            upstream_outcomes=(),
            cycle=(),
        )

    def fire(self, inp: FireProposed) -> None:
        job, spec, cfg = self.job, self.job.spec, self.config
        if job.deleted or job.paused:
            return self.reject("job is paused or deleted")
        if inp.scheduled_ms <= job.fired_ms:
            return self.reject("already decided")  # the common duplicate: no change
        if inp.scheduled_ms - self.at > cfg.max_lead_ms:
            return self.reject("proposed too early")
        if spec.schedule is None:
            # A step is proposed only when the wait of its first open period runs out
            # (max_runs limits a schedule's firings, never a step's periods).
            if not spec.depends_on or inp.scheduled_ms != job.next_due_ms:
                return self.reject("not a fire time of the step")
            if inp.scheduled_ms > self.at:
                return self.reject("proposed before its time (its wait runs out at it)")
            return self._dag_steps()
        if spec.max_runs is not None and job.schedule_runs >= spec.max_runs:
            if job.next_due_ms is not None:
                self.set_job(next_due_ms=None)  # the schedule is done: nothing to propose
            return self.reject(f"the schedule made its {spec.max_runs} runs (max_runs)")
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
        # The newest `max_catchup_runs` times of the window: the newest are the ones that
        # matter (the on-time firing is among them); older ones are dropped unrecorded.
        count = self.config.max_catchup_runs
        times = newest_fires(spec.schedule, self._floor(latest_due), latest_due, spec.dst, count)
        self._decide_times(times, latest_due, due_after(spec, latest_due))

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
            if spec.max_runs is not None and self.job.schedule_runs >= spec.max_runs:
                next_due = None  # the schedule is done: later times are not due
                break
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
        times = newest_fires(spec.schedule, window_start, t, spec.dst, 1)
        return times[-1] if times else self.job.fired_ms

    def _fire_one(self, scheduled: int, period_start: int) -> None:
        spec = self.job.spec
        run_id = scheduled_run_id(spec.job_id, scheduled)
        existing = self.run(run_id)
        if existing is not None and existing.cancelling in WITHDRAWN:
            # Withdrawn, but its holder has not answered yet: the firing is wanted after
            # all, so the run stays. Should the stop order make the holder release the
            # attempt, it is dispatched again like any attempt released. It still counts
            # for max_runs (a pending withdrawal gives nothing back).
            self.runs[run_id] = replace(existing, cancelling="", updated_ms=self.at)
            return None
        if existing is not None and not withdrawn(existing):
            return None  # decided once already: one run per (job, scheduled time)
        calendar = excluded_by(spec, scheduled)
        if calendar is not None:
            if existing is not None:
                return None  # stays withdrawn: its record says it did not run
            return self._skip(scheduled, "schedule", skip_reason(calendar))
        if spec.params:
            try:
                resolve(spec.params, ())
            except ParamError as exc:  # a value without a default: the firing cannot run
                if existing is not None:
                    return None  # stays withdrawn: its record says it did not run
                return self._skip(scheduled, "schedule", f"{exc}: give it to run-now")
        live = [r for r in (self.run(x) for x in self.job.live_runs) if r and not r.final]
        if live and spec.concurrency == "forbid":
            if existing is not None:
                return None  # stays withdrawn: its record says it did not run
            return self._skip(scheduled, "schedule", f"concurrency forbid: {live[0].run_id} live")
        if live and spec.concurrency == "replace":
            for old in live:
                self._cancel_run(old, f"replaced by {run_id}")
        self.set_job(schedule_runs=self.job.schedule_runs + 1)
        if existing is not None:
            return self._revive(existing, period_start)
        self._create(scheduled, "schedule", run_id, period_start=period_start)
        return None

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
        try:  # the values, and the command they make as written (`written`)
            written(self.job.spec, resolve(self.job.spec.params, inp.params))
        except ParamError as exc:  # written past the API's check: nothing runs
            return self.reject(f"job {self.job.spec.job_id}: {exc}", dead_letter=True)
        most = self.config.max_live_manual_runs
        live = sum(1 for r in self.job.live_runs if "@manual:" in r)
        if live >= most:
            # A run-now flood written to the topic past the API's quotas (owner fairness):
            # refused, not remembered, so the same request may be sent again later.
            return self.reject(
                f"quota max_live_manual_runs: job {self.job.spec.job_id} has {live} run-now "
                f"runs not finished (at most {most}); send it again once some end",
                dead_letter=True,
            )
        self._remember(inp.request_id, inp.at_ms)
        self._create(self.at, "manual", run_id, inp.request_id, given=inp.params)
        return None

    def backfill(self, inp: BackfillRequested) -> None:
        """Runs for times the schedule never decided: before the job's registration, and
        not decided by an earlier backfill (the spans say so even once its runs are
        forgotten). A backfill accepted joins the job's queue of pending backfills
        (`JobState.backfill_queue`); `pace_backfills` creates its runs, never more than
        `backfill_live_runs` live at once, and the rest as those finish, up to
        `max_backfill_runs` runs in all. A request id `<id>+next` is the ledger's own
        nudge to go on (written when one transaction looked at `max_catchup_runs` times
        and there was room for more); `<id>+<runs so far>` is a continuation written
        before pacing (it joins the queue as its remainder). Neither form is a user id."""
        spec, cfg = self.job.spec, self.config
        if self.job.deleted:
            return self.reject("job is deleted")
        request, _, so_far = inp.request_id.partition("+")
        if so_far == "next":
            if not self.job.backfill_queue:
                return self.reject("nothing pending to backfill")
            self.pace_backfills()
            if self._backfill_stopped:
                self.reject(self._backfill_stopped)
            return None
        created = int(so_far) if so_far.isdigit() else 0
        if inp.params:
            try:
                written(spec, resolve(spec.params, inp.params))
            except ParamError as exc:  # written past the API's check: nothing is created
                return self.reject(f"job {spec.job_id}: {exc}", dead_letter=True)
        upper = min(inp.to_ms, self.job.created_ms)
        if not fires_between(spec.schedule, inp.from_ms - 1, upper, spec.dst, limit=1):
            if not so_far:
                self._check_and_remember(inp)
            return self.reject("nothing to backfill: before registration, not backfilled yet")
        if len(self.job.backfill_queue) >= cfg.max_pending_backfills:
            # Not remembered: the same request may be sent again once the queue drains.
            return self.reject(
                f"quota max_pending_backfills: job {spec.job_id} holds "
                f"{len(self.job.backfill_queue)} backfills not fully created (at most "
                f"{cfg.max_pending_backfills}); send it again once they are",
                dead_letter=not so_far,
            )
        if not so_far and not self._check_and_remember(inp):
            return None
        pending = PendingBackfill(
            inp.request_id if not so_far else request,
            inp.from_ms,
            inp.to_ms,
            inp.at_ms,
            created,
            inp.params,
        )
        self.set_job(backfill_queue=(*self.job.backfill_queue, pending))
        before = self._backfill_runs_made
        self.pace_backfills()
        still = any(b.request_id == pending.request_id for b in self.job.backfill_queue)
        if self._backfill_stopped:
            self.reject(self._backfill_stopped)
        elif self._backfill_runs_made == before and not still:
            # Nothing new in its range: the earlier spans decided it all.
            self.reject("nothing to backfill: before registration, not backfilled yet")
        return None

    def _check_and_remember(self, inp: BackfillRequested) -> bool:
        """A user's backfill request: refused if it was applied already, else remembered."""
        duplicate = self._duplicate(inp.request_id, inp.at_ms)
        if duplicate:
            self.reject(duplicate)
            return False
        self._remember(inp.request_id, inp.at_ms)
        return True

    _backfill_runs_made = 0  # runs `pace_backfills` created in this decision
    _backfill_stopped = ""  # a backfill it stopped at `max_backfill_runs`, and where

    def _live_backfill_runs(self) -> int:
        """The job's live runs of times up to its registration: backfill runs (the
        schedule decides only times after it), read from their ids."""
        first = self.job.created_ms
        count = 0
        for run_id in self.job.live_runs:
            scheduled = _scheduled_ms(run_id)
            if scheduled is not None and scheduled <= first:
                count += 1
        return count

    def pace_backfills(self) -> None:
        """Create the queued backfills' next runs, oldest backfill first, while the job
        holds fewer than `backfill_live_runs` live backfill runs, looking at no more
        than `max_catchup_runs` fire times. Called after every input that may have
        made room (a backfill accepted, a run of the job ended): deterministic, on the
        job's own log. When it stopped for its look limit with room left, it writes a
        nudge (`<id>+next`) to the job's log to go on in a later transaction."""
        spec, cfg = self.job.spec, self.config
        queue = self.job.backfill_queue
        if not queue:
            return
        if self.job.deleted:
            self.set_job(backfill_queue=())
            return
        looked = 0
        room = cfg.backfill_live_runs - self._live_backfill_runs()
        while queue and room > 0 and looked < cfg.max_catchup_runs:
            head = queue[0]
            upper = min(head.to_ms, self.job.created_ms)
            limit = min(room, cfg.max_backfill_runs - head.created, cfg.max_catchup_runs - looked)
            times = (
                fires_between(spec.schedule, head.from_ms - 1, upper, spec.dst, limit=limit)
                if limit > 0
                else []
            )
            looked += max(1, len(times))
            spans = self.job.backfilled
            fresh = [
                t
                for t in times
                if not any(s.after_ms < t <= s.until_ms for s in spans)
                and self.run(scheduled_run_id(spec.job_id, t)) is None
            ]
            previous = head.from_ms - 1
            for t in fresh:
                run_id = scheduled_run_id(spec.job_id, t)
                self._create(t, "backfill", run_id, period_start=previous, given=head.params)
                previous = t
            if fresh:
                # Decided: (from - 1, the last time created].
                merged = _merge(spans, Span(head.from_ms - 1, fresh[-1]), cfg.keep_spans)
                self.set_job(backfilled=merged)
            self._backfill_runs_made += len(fresh)
            made = head.created + len(fresh)
            if len(times) < limit or times[-1] >= upper or limit <= 0:
                queue = queue[1:]  # its range is done (or its run limit reached)
            elif made >= cfg.max_backfill_runs:
                queue = queue[1:]  # stopped at its limit: the API refuses such a range
                self._backfill_stopped = (
                    f"backfill {head.request_id.partition('+')[0]!r} stopped at "
                    f"{cfg.max_backfill_runs} runs; the range from {times[-1] + 1} ms on "
                    "was not backfilled"
                )
            else:
                queue = (replace(head, from_ms=times[-1] + 1, created=made), *queue[1:])
            room = cfg.backfill_live_runs - self._live_backfill_runs()
        self.set_job(backfill_queue=queue)
        if queue and room > 0:
            head = queue[0]
            request = head.request_id.partition("+")[0]
            self.notices.append(
                BackfillRequested(
                    spec.job_id, head.from_ms, head.to_ms, head.at_ms, f"{request}+next", ()
                )
            )

    def rerun(self, inp: RerunRequested) -> None:
        run = self.run(inp.run_id)
        duplicate = self._duplicate(inp.request_id, inp.at_ms)
        if duplicate:
            return self.reject(duplicate)
        if run is None:
            return self.reject(f"unknown or forgotten run {inp.run_id}")
        if not run.final:
            return self.reject(f"run {inp.run_id} is still {run.state}")
        try:  # declared since the run was made (it has no value), or too large as written
            written(self.job.spec, self.values(run))
        except ParamError as exc:
            return self.reject(f"job {self.job.spec.job_id}: {exc}", dead_letter=True)
        self._remember(inp.request_id, inp.at_ms)
        self.set_job(
            live_runs=(*self.job.live_runs, run.run_id),
            final_runs=tuple(r for r in self.job.final_runs if r != run.run_id),
        )
        self._due(run, run.attempt + 1, self.at, f"rerun {inp.request_id}")
        return None
