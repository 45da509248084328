"""The periods of DAG steps (``missing_period``).

DAG steps. A job without a schedule and with upstreams runs once per period: when an
upstream's (non-manual, not withdrawn ahead of its time) run ends, the step's ledger
records a run for that scheduled time (trigger ``dependency``) if every upstream's
latest outcome since the step's last record (its watermark) succeeded, records it as
skipped if that run did not succeed, and otherwise waits; a record at t stands for
every outcome up to t. The checks follow the watermark through each life of the step
(from its registration or resume to its pause, deletion, a change of its upstreams, or
``now - safety_margin``), and consider
the outcomes whose final event lies more than `notice_lag_ms` inside the life (the
notice was surely decided while the step was active), of its upstreams of its own owner
only: an upstream of another owner refuses the step's link and the step refuses its
notices, so its outcomes never decide a period (they are missing to the ledger, which
skips the periods they would have decided when the dependency wait runs out; while a
period waits for them, a failure of another upstream waits behind it too, as below).
``missing_period``, for an outcome with no record at its time:

- it was decided while the step's watermark was below it, and no record at or after
  its time was made before it: with one upstream, whose notices are decided in the order
  of its final events, "before" is told exactly; with several, a record made more than
  `notice_lag_ms` plus the dependency wait after it (a failure waits behind an earlier
  period still open on another upstream until that wait runs out). A failed outcome then
  owed a skip record; with one upstream, a succeeded one owed a run;
- with several upstreams, a succeeded outcome after the last record, when every other
  upstream had a succeeded outcome since that record, not after it, decided surely
  before it (a final event `notice_lag_ms` earlier): the step should have run. Checked
  while fewer than `keep_upstream_outcomes` outcomes wait (the ledger keeps no more).

A period of several upstreams covered by a later record cannot be told from one the
ledger folded into it, and is not checked. Jobs with a schedule and upstreams have one
run per fire time (``missing_firing``), ``waiting`` until its upstreams are done
(``not_final`` past the dependency wait).
"""

from __future__ import annotations

import bisect

from connectors.audit.config import AuditConfig
from connectors.audit.findings import Findings
from connectors.audit.history import AuditedJob, History
from schemas.records import RunEvent
from schemas.spec import JobSpec
from streams.core.ids import iso_utc, scheduled_run_id
from streams.core.ledger.decision import WITHDRAWN


def is_outcome(e: RunEvent) -> bool:
    """A final event the ledger tells a job's dependents of: not a manual run's, nor a
    firing withdrawn ahead of its time (it may be revived; its time joins the dependents'
    next period)."""
    return e.trigger != "manual" and not (e.state == "cancelled" and e.reason in WITHDRAWN)


def missing_periods(
    history: History, job: AuditedJob, until: int, config: AuditConfig, findings: Findings
) -> int | None:
    """Check the lives of a DAG step (see the module docstring); returns the number
    of its records, or None if it never was a step in the replay."""
    lag = config.notice_lag_ms
    lives = _step_lives(job.timeline, job.fires, until)
    if not lives:
        return None
    # The step's records by scheduled time.
    records = sorted((t, at) for t, (_, at, _, _) in job.fires.items())
    times = [t for t, _ in records]
    owner = _owner(job)
    for start, end, since, fired, upstreams in lives:
        # Outcomes after the life's starting watermark: (scheduled, final at, ok, upstream).
        outcomes: list[tuple[int, int, bool, str]] = []
        for upstream in upstreams:
            other = history.jobs.get(upstream)
            if other is None or _owner(other) != owner:
                continue  # never told to the step (see the module docstring)
            finals = other.finals
            for i in range(0, len(finals), 2):
                if finals[i] > since:
                    at = finals[i + 1]
                    ok = at >= 0
                    outcomes.append((finals[i], at if ok else -at - 1, ok, upstream))
        # When each record was made, as comparable with an outcome's final time: with
        # one upstream, the time of its first final event for the record's time (the
        # notices of one upstream are decided in the order of its final events);
        # with several, when the step's ledger made it, less the notice lag. Then the
        # earliest of those at or after each record.
        if len(upstreams) == 1:
            first: dict[int, int] = {}
            for scheduled, at, _, _ in outcomes:
                first[scheduled] = min(at, first.get(scheduled, at))
            made = [first.get(t, -1) for t, _ in records]  # -1: before anything
            slack = 1  # strictly before
        else:
            # A failure waits behind an earlier period still open on another upstream
            # until that period's dependency wait runs out.
            made = [at for _, at in records]
            slack = lag + config.dependency_wait_ms
        for i in range(len(made) - 2, -1, -1):
            made[i] = min(made[i], made[i + 1])
        flagged: set[tuple[str, int]] = set()
        for scheduled, at, ok, upstream in outcomes:
            if not start + lag < at < end - max(lag, slack) or scheduled in job.fires:
                continue
            i = bisect.bisect_left(times, scheduled)
            if i < len(times) and at + slack > made[i]:
                continue  # a record at or after it may have been made first
            if ok and len(upstreams) > 1:
                continue  # whether the others had succeeded: see below
            if (upstream, scheduled) in flagged:
                continue
            flagged.add((upstream, scheduled))
            due = "a run" if ok else "a skip record"
            _missing_period(
                history,
                findings,
                job,
                upstream,
                scheduled,
                f"upstream {upstream}'s run for {iso_utc(scheduled)} "
                f"{'succeeded' if ok else 'did not succeed'} (final at {iso_utc(at)}) "
                f"while {job.job_id}'s last record was older: {due} was due for it, "
                "and there is no record at or after it made before its notice",
            )
        if flagged or len(upstreams) < 2:
            continue
        # Several upstreams: the step runs when every one succeeded since its watermark.
        tail = [o for o in outcomes if o[0] > fired]
        if not all(o[2] for o in tail) or len(tail) >= config.keep_upstream_outcomes:
            continue
        for scheduled, at, _, upstream in sorted(tail, reverse=True):
            if not start + lag < at < end - lag:
                continue
            if all(
                other == upstream
                or any(
                    o[3] == other and o[0] <= scheduled and start + lag < o[1] <= at - lag
                    for o in tail
                )
                for other in upstreams
            ):
                _missing_period(
                    history,
                    findings,
                    job,
                    upstream,
                    scheduled,
                    f"every upstream of {job.job_id} succeeded in ({iso_utc(fired)}, "
                    f"{iso_utc(scheduled)}], the last being {upstream} (final at "
                    f"{iso_utc(at)}), but the step has no record at or after it",
                )
                break
    return len(job.fires)


def _owner(job: AuditedJob) -> str | None:
    """The job's owner: the one that registered it (a job id is never passed on, even
    after a delete, so every spec the replay saw of it says the same)."""
    for _, _, spec in job.timeline:
        if spec is not None:
            return spec.owner
    return job.spec.owner if job.spec is not None else None


def _missing_period(
    history: History,
    findings: Findings,
    job: AuditedJob,
    upstream: str,
    scheduled: int,
    detail: str,
) -> None:
    run_id = scheduled_run_id(upstream, scheduled)
    run = history.runs.get(run_id)
    partition, offset = (run.partition, run.offset) if run else (job.partition, job.offset)
    findings.violate("missing_period", job.job_id, run_id, partition, offset, detail)


def _step_lives(
    timeline: list[tuple[str, int, JobSpec | None]],
    fires: dict[int, tuple[str, int, int, int]],
    until: int,
) -> list[tuple[int, int, int, int, tuple[str, ...]]]:
    """The lives of a DAG step: (start, end, its watermark at the start and at the end,
    its upstreams), following the ledger's watermark: a registration sets it (never
    lower than a former life's), a schedule change too, a pause or deletion lowers it to
    its time, a resume raises it to its time, and each record (run or skip) at t raises
    it to t."""
    records = sorted((at, t) for t, (_, at, _, _) in fires.items())
    out: list[tuple[int, int, int, int, tuple[str, ...]]] = []
    spec: JobSpec | None = None
    start: int | None = None
    since = 0  # the watermark at the start of the open life
    fired: int | None = None
    registered = paused = deleted = False
    i = 0

    def step(s: JobSpec | None) -> tuple[str, ...]:
        return s.depends_on if s is not None and s.schedule is None else ()

    def advance(to: int) -> None:  # the records made before `to`
        nonlocal i, fired
        while i < len(records) and records[i][0] < to:
            fired = records[i][1] if fired is None else max(fired, records[i][1])
            i += 1

    def close(at: int) -> None:
        advance(at if at < until else records[-1][0] + 1 if records else at)
        if start is not None and fired is not None and step(spec) and start < min(at, until):
            out.append((start, min(at, until), since, fired, step(spec)))

    def begin(at: int) -> None:
        nonlocal start, since
        start, since = at, at if fired is None else fired

    for kind, at, new in timeline:
        advance(at)
        if kind == "upserted" and new is not None:
            if not registered or deleted:
                registered, paused, deleted = True, False, False
                spec = new
                fired = at if fired is None else max(fired, at)
                begin(at)
            else:
                assert spec is not None
                retimed = (new.schedule, new.dst) != (spec.schedule, spec.dst)
                if (step(new) != step(spec) or retimed) and not paused:
                    close(at)
                if retimed:
                    fired = at  # the ledger's watermark moves to a schedule change
                if (step(new) != step(spec) or retimed) and not paused:
                    begin(at)
                spec = new
        elif not registered or deleted:
            continue
        elif kind == "paused" and not paused:
            close(at)
            paused, start = True, None
            fired = at if fired is None else min(fired, at)
        elif kind == "resumed" and paused:
            paused = False
            fired = at if fired is None else max(fired, at)
            begin(at)
        elif kind == "deleted":
            if not paused:
                close(at)
            deleted, start = True, None
            fired = at if fired is None else min(fired, at)
    close(until)
    return out
