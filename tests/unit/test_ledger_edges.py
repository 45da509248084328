"""The ledger's edges (issue 12): one clock, exact job changes, firings never lost or
doubled whatever order their inputs arrive in, bounded memory that still deduplicates.

`now` in these tests is the broker's append time of the input (what the ledger process
passes as `now_ms`); `at_ms` is whatever its producer stamped, skewed on purpose.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from schemas.records import (
    BackfillRequested,
    ClaimRequested,
    FireProposed,
    JobDeleted,
    JobPaused,
    JobResumed,
    JobUpserted,
    RunFinished,
    RunNowRequested,
    RunReleased,
    RunStarted,
    UpstreamFinished,
)
from schemas.spec import AtSchedule, CronSchedule, EverySchedule, JobSpec
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.ledger import WITHDRAWN_BY_PAUSE, LedgerConfig
from tests.support.world import World

T0 = 1_800_000_000_000
S = 1000
MIN = 60 * S
HOUR = 60 * MIN


def spec(job_id: str = "j", every: int = MIN, **changes: object) -> JobSpec:
    base = JobSpec(job_id=job_id, owner="o", schedule=EverySchedule(every), command=("true",))
    return replace(base, **changes)  # type: ignore[arg-type]


def registered(*specs: JobSpec, config: LedgerConfig | None = None) -> World:
    w = World(config or LedgerConfig())
    for s in specs:
        w.apply(JobUpserted(s, T0))
    return w


def run_to_end(
    w: World, job_id: str, run_id: str, at: int, code: int = 0, attempt: int = 1
) -> None:
    w.apply(ClaimRequested(job_id, run_id, attempt, "w1", at))
    w.apply(RunStarted(job_id, run_id, attempt, "w1", at))
    w.apply(RunFinished(job_id, run_id, attempt, "w1", code, "", at))


# -- one clock -------------------------------------------------------------------------
def test_a_proposal_from_a_clock_hours_ahead_decides_nothing() -> None:
    w = registered(spec())
    ahead = T0 + 10 * HOUR
    w.apply(FireProposed("j", ahead, ahead, "skewed"), now=T0 + 5 * S)
    assert w.rejections[-1] == "proposed too early"
    assert w.jobs["j"].fired_ms == T0
    assert w.run_events() == []


def test_a_registration_stamped_a_year_ahead_applies_from_the_broker_time() -> None:
    w = World()
    w.apply(JobUpserted(spec(), T0 + 365 * 24 * HOUR), now=T0)
    job = w.jobs["j"]
    assert (job.created_ms, job.fired_ms, job.next_due_ms) == (T0, T0, T0 + MIN)


def test_a_worker_lost_verdict_is_judged_by_broker_time_not_its_stamp() -> None:
    w = registered(spec())
    t = T0 + MIN
    w.apply(FireProposed("j", t, t - 10 * S, "n"), now=t - 10 * S)  # pre-dispatched
    run_id = scheduled_run_id("j", t)
    w.apply(ClaimRequested("j", run_id, 1, "w1", t - 9 * S), now=t - 9 * S)
    # The verdict is stamped (by a skewed dispatcher) before the start time, but the
    # broker appended it after: the run may have started, so it is not released.
    from schemas.records import WorkerLost

    w.apply(WorkerLost("j", run_id, 1, "w1", t - 5 * S), now=t + 5 * S)
    assert w.runs[run_id].state == "failed"
    assert w.runs[run_id].reason == "lost: worker w1"


def test_a_one_off_whose_time_passed_before_registration_still_runs() -> None:
    at = T0 - 2 * S  # the command reached ingress two seconds after the one-off's time
    w = World()
    w.apply(JobUpserted(spec(schedule=AtSchedule(at)), T0))
    assert w.jobs["j"].next_due_ms == at
    w.apply(FireProposed("j", at, T0 + 50, "n"))
    assert w.states(scheduled_run_id("j", at)) == ["due"]


def test_a_one_off_long_past_at_registration_is_recorded_as_skipped() -> None:
    at = T0 - 3 * HOUR
    w = World()
    w.apply(JobUpserted(spec(schedule=AtSchedule(at), misfire="skip"), T0))
    w.apply(FireProposed("j", at, T0 + 50, "n"))
    run = w.runs[scheduled_run_id("j", at)]
    assert (run.state, run.reason) == ("skipped", "misfire (skip)")


def test_a_one_off_older_than_the_catch_up_window_leaves_a_record() -> None:
    at = T0 - 3 * 24 * HOUR
    w = World()
    w.apply(JobUpserted(spec(schedule=AtSchedule(at), misfire="run_once"), T0))
    w.apply(FireProposed("j", at, T0 + 50, "n"))
    assert w.states(scheduled_run_id("j", at)) == ["due"]


# -- firings ---------------------------------------------------------------------------
def test_a_backfill_sent_twice_creates_each_run_once_even_after_forgetting() -> None:
    w = registered(spec(), config=LedgerConfig(keep_final_runs=2, backfill_live_runs=100))
    start = T0 - 50 * MIN
    w.apply(BackfillRequested("j", start, T0, T0 + 1, "b1"))
    created = [r for r in w.runs.values() if r.trigger == "backfill"]
    assert len(created) == 51  # [start, registration], both ends included
    for n, run in enumerate(sorted(created, key=lambda r: r.scheduled_ms)):
        run_to_end(w, "j", run.run_id, T0 + 10 + n)
    assert len([r for r in w.runs.values() if r.trigger == "backfill"]) == 2  # forgotten
    w.apply(BackfillRequested("j", start, T0, T0 + 100, "b1"))  # the same request again
    assert w.rejections[-1] == "duplicate request"
    w.apply(BackfillRequested("j", start, T0, T0 + 200, "b2"))  # a new request, same span
    assert w.rejections[-1].startswith("nothing to backfill")
    per_run = [e.run_id for e in w.run_events() if e.state == "due"]
    assert len(per_run) == len(set(per_run)) == 51


def test_a_backfill_past_one_transaction_carries_on_to_the_end_of_its_range() -> None:
    """1,000 fire times a transaction; the rest of the range follows after nudges on the
    job's log (the world delivers them as Kafka would): every time once, none past it.
    (Pacing by live runs is lifted here: tests/unit/test_backfill_pacing.py has it.)"""
    config = LedgerConfig(max_catchup_runs=100, keep_final_runs=2, backfill_live_runs=10**6)
    w = registered(spec(), config=config)
    start = T0 - 349 * MIN
    w.apply(BackfillRequested("j", start, T0, T0 + 1, "b1"))
    times = sorted(e.scheduled_ms for e in w.run_events() if e.state == "due")
    assert times == list(range(start, T0 + 1, MIN))  # 350 runs, [start, registration]
    assert w.jobs["j"].backfilled[-1].until_ms == T0
    w.apply(BackfillRequested("j", start, T0, T0 + 100, "b1"))  # the request again
    assert w.rejections[-1] == "duplicate request"
    w.apply(BackfillRequested("j", start - 150 * MIN, T0, T0 + 200, "b2"))  # overlapping
    again = [e.scheduled_ms for e in w.run_events() if e.state == "due"]
    assert len(again) == len(set(again)) == 500  # only the 150 new times were added


def test_a_backfill_stops_at_its_run_limit_and_says_where() -> None:
    config = LedgerConfig(max_catchup_runs=100, max_backfill_runs=250, backfill_live_runs=10**6)
    w = registered(spec(), config=config)
    start = T0 - 999 * MIN
    w.apply(BackfillRequested("j", start, T0, T0 + 1, "big"))
    times = sorted(e.scheduled_ms for e in w.run_events() if e.state == "due")
    assert times == list(range(start, start + 250 * MIN, MIN))
    assert w.rejections[-1].startswith("backfill 'big' stopped at 250 runs")
    assert str(start + 249 * MIN + 1) in w.rejections[-1]


def test_a_run_now_redelivered_after_many_newer_requests_is_refused() -> None:
    w = registered(spec(), config=LedgerConfig(keep_request_ids=5, keep_final_runs=1))
    for n in range(12):
        w.apply(RunNowRequested("j", f"r{n}", T0 + n))
        run_to_end(w, "j", manual_run_id("j", f"r{n}"), T0 + n)
    assert len(w.jobs["j"].recent_requests) == 5
    w.apply(RunNowRequested("j", "r0", T0))  # the first command, delivered again
    assert w.rejections[-1].startswith("request older than")
    assert w.states(manual_run_id("j", "r0")) == ["due", "dispatched", "running", "succeeded"]
    w.apply(RunNowRequested("j", "r99", T0 + 20))  # a new request still runs
    assert w.states(manual_run_id("j", "r99")) == ["due"]


def test_forbid_is_decided_at_the_firing_time_not_at_the_proposal() -> None:
    w = registered(spec(every=MIN, concurrency="forbid"))
    t1, t2 = T0 + MIN, T0 + 2 * MIN
    w.apply(FireProposed("j", t1, t1, "n"))
    r1 = scheduled_run_id("j", t1)
    w.apply(ClaimRequested("j", r1, 1, "w1", t1))
    w.apply(RunStarted("j", r1, 1, "w1", t1))
    w.apply(FireProposed("j", t2, t2 - 10 * S, "n"))  # pre-dispatch lead: refused
    assert w.rejections[-1].startswith("proposed before its time")
    w.apply(RunFinished("j", r1, 1, "w1", 0, "", t2 - 5 * S))  # ends before t2
    w.apply(FireProposed("j", t2, t2, "n"))
    assert w.states(scheduled_run_id("j", t2)) == ["due"]


def test_replace_does_not_cancel_a_run_before_the_next_firing() -> None:
    w = registered(spec(every=MIN, concurrency="replace"))
    t1, t2 = T0 + MIN, T0 + 2 * MIN
    w.apply(FireProposed("j", t1, t1, "n"))
    r1 = scheduled_run_id("j", t1)
    w.apply(ClaimRequested("j", r1, 1, "w1", t1))
    w.apply(RunStarted("j", r1, 1, "w1", t1))
    w.apply(FireProposed("j", t2, t2 - 10 * S, "n"))
    assert w.runs[r1].state == "running"
    w.apply(FireProposed("j", t2, t2, "n"))
    assert w.runs[r1].state == "cancelled"


def test_a_schedule_change_applies_from_its_own_time_exactly() -> None:
    w = registered(spec(every=10 * S))
    # Runs decided ahead up to T0+60 s (pre-dispatch), then the schedule changes at +35 s.
    for n in range(1, 7):
        t = T0 + n * 10 * S
        w.apply(FireProposed("j", t, T0 + 5 * S, "n"))
    assert w.jobs["j"].fired_ms == T0 + 60 * S
    changed = T0 + 35 * S
    w.apply(JobUpserted(spec(every=15 * S), changed), now=changed + 2 * S)
    job = w.jobs["j"]
    assert job.fired_ms == changed
    # Old times after the change that the new schedule does not have are withdrawn...
    for n in (4, 5):
        run = w.runs[scheduled_run_id("j", T0 + n * 10 * S)]
        assert run.state == "cancelled"
    # ...one it shares (T0+60 s) is kept, and the new schedule's times after the change
    # are all fired, none lost.
    assert w.runs[scheduled_run_id("j", T0 + 60 * S)].state == "due"
    assert job.next_due_ms == T0 + 45 * S
    w.apply(FireProposed("j", T0 + 45 * S, T0 + 40 * S, "n"))
    w.apply(FireProposed("j", T0 + 60 * S, T0 + 50 * S, "n"))
    assert w.states(scheduled_run_id("j", T0 + 45 * S)) == ["due"]
    assert w.states(scheduled_run_id("j", T0 + 60 * S)) == ["due"]


def test_a_change_first_decides_the_old_schedules_firings_before_it() -> None:
    w = registered(spec(every=10 * S))
    # The firing at +10 s was not proposed yet (a slow node) when the change at +12 s came.
    w.apply(JobUpserted(spec(every=7 * S), T0 + 12 * S), now=T0 + 13 * S)
    assert w.states(scheduled_run_id("j", T0 + 10 * S)) == ["due"]
    next_due = w.jobs["j"].next_due_ms
    assert next_due is not None
    assert T0 + 12 * S < next_due <= T0 + 19 * S


def test_pause_then_resume_before_the_firing_revives_it() -> None:
    w = registered(spec())
    t = T0 + MIN
    w.apply(FireProposed("j", t, t - 10 * S, "n"))
    run_id = scheduled_run_id("j", t)
    w.apply(ClaimRequested("j", run_id, 1, "w1", t - 9 * S))
    w.apply(JobPaused("j", t - 8 * S))
    w.apply(RunReleased("j", run_id, 1, "w1", "cancelled before the start", t - 7 * S))
    assert (w.runs[run_id].state, w.runs[run_id].reason) == ("cancelled", WITHDRAWN_BY_PAUSE)
    w.apply(JobResumed("j", t - 5 * S))
    assert w.jobs["j"].next_due_ms == t
    w.apply(FireProposed("j", t, t - 4 * S, "n"))
    run = w.runs[run_id]
    assert (run.state, run.attempt) == ("due", 2)
    # The withdrawn attempt can neither start nor be reported.
    w.apply(RunStarted("j", run_id, 1, "w1", t))
    assert w.rejections[-1].startswith("stale attempt 1")


def test_delete_then_recreate_revives_withdrawn_firings_and_keeps_live_runs() -> None:
    w = registered(spec(every=MIN, concurrency="forbid"))
    t1, t2 = T0 + MIN, T0 + 2 * MIN
    w.apply(FireProposed("j", t1, t1, "n"))
    r1 = scheduled_run_id("j", t1)
    w.apply(ClaimRequested("j", r1, 1, "w1", t1))
    w.apply(RunStarted("j", r1, 1, "w1", t1))  # running through the delete
    w.apply(JobDeleted("j", t1 + 10 * S))
    w.apply(JobUpserted(spec(every=MIN, concurrency="forbid"), t1 + 20 * S))
    assert r1 in w.jobs["j"].live_runs  # the old life's running run still counts
    w.apply(FireProposed("j", t2, t2, "n"))
    assert w.runs[scheduled_run_id("j", t2)].state == "skipped"  # forbid saw it


def test_a_deleted_job_keeps_a_small_stub() -> None:
    w = registered(spec(), config=LedgerConfig(keep_final_runs=5))
    for n in range(1, 6):
        t = T0 + n * MIN
        w.apply(FireProposed("j", t, t, "n"))
        run_to_end(w, "j", scheduled_run_id("j", t), t)
    w.apply(JobDeleted("j", T0 + 10 * MIN))
    job = w.jobs["j"]
    assert job.deleted
    assert job.final_runs == ()
    assert not [r for r in w.runs.values() if r.job_id == "j"]


def test_dag_periods_are_decided_by_their_own_outcomes_in_any_order() -> None:
    w = registered(spec("a"), spec("b"), spec("step", schedule=None, depends_on=("a", "b")))
    w.deliver_notices = True
    t1, t2 = T0 + MIN, T0 + 2 * MIN
    step1, step2 = scheduled_run_id("step", t1), scheduled_run_id("step", t2)
    w.apply(UpstreamFinished("step", "a", t1, True, t1 + 5, t2))
    w.apply(UpstreamFinished("step", "a", t2, False, t2 + 5, t2 + MIN))  # before b's t1
    assert step1 not in w.runs
    assert step2 not in w.runs
    w.apply(UpstreamFinished("step", "b", t1, True, t2 + 6, t2))
    assert w.states(step1) == ["due"]
    assert w.runs[step2].state == "skipped"
    assert w.runs[step2].reason == "upstream a did not succeed"


def test_a_dag_period_whose_upstream_never_reports_is_skipped_with_a_record() -> None:
    config = LedgerConfig(dependency_wait_ms=HOUR)
    w = registered(
        spec("a"), spec("b"), spec("step", schedule=None, depends_on=("a", "b")), config=config
    )
    t1 = T0 + MIN
    w.apply(UpstreamFinished("step", "a", t1, True, t1 + 5, t1 + MIN))
    later = t1 + 2 * HOUR
    w.apply(UpstreamFinished("step", "a", later, True, later + 5, later + MIN))
    run = w.runs[scheduled_run_id("step", t1)]
    assert (run.state, run.reason) == ("skipped", "upstream b did not finish in time")


def test_lost_attempts_of_a_non_idempotent_job_are_not_retried() -> None:
    retrying = replace(spec().retry, max_attempts=3, backoff_s=0)
    for idempotent, after in ((False, "failed"), (True, "retrying")):
        w = registered(spec(retry=retrying, idempotent=idempotent))
        t = T0 + MIN
        w.apply(FireProposed("j", t, t, "n"))
        run_id = scheduled_run_id("j", t)
        w.apply(ClaimRequested("j", run_id, 1, "w1", t))
        w.apply(RunStarted("j", run_id, 1, "w1", t))
        w.apply(RunFinished("j", run_id, 1, "w1", None, "lost: executor died", t + 1))
        assert w.runs[run_id].state == after


def test_a_claim_reply_carries_the_claims_own_stamp() -> None:
    # The worker matches a reply to its claim by the stamp it sent, whatever the broker's
    # time of the claim.
    w = registered(spec())
    t = T0 + MIN
    w.apply(FireProposed("j", t, t, "n"))
    run_id = scheduled_run_id("j", t)
    decision = w.apply(ClaimRequested("j", run_id, 1, "w1", t - 8 * S), now=t + 1)
    (reply,) = decision.replies
    assert reply.at_ms == t - 8 * S
    assert w.runs[run_id].updated_ms == t + 1


def test_a_late_misfire_never_overwrites_a_run_decided_before_a_change() -> None:
    w = registered(spec(every=3 * S, misfire="skip"))
    t = T0 + 15 * S  # a time of both schedules
    w.apply(FireProposed("j", t, t - 2 * S, "n"))
    w.apply(JobUpserted(spec(every=5 * S, misfire="skip"), t - S), now=t - S)
    w.apply(JobPaused("j", t + 3 * MIN), now=t + 3 * MIN)  # decides (change, pause] late
    assert w.states(scheduled_run_id("j", t)) == ["due"]


def test_a_job_cannot_hang_on_another_owners_job() -> None:
    """depends_on names only the owner's own jobs: the ledger refuses the link at a
    registered upstream, and an outcome from an upstream another owner registered after
    the link (the id was a placeholder then) is not taken."""
    config = LedgerConfig(dependency_wait_ms=HOUR)
    w = registered(spec("a"), config=config)
    w.apply(JobUpserted(spec("spy", owner="other", schedule=None, depends_on=("a",)), T0))
    assert w.jobs["a"].dependents == ()
    assert any("cannot depend on a of owner 'o'" in r for r in w.rejections)
    t1 = T0 + MIN
    w.apply(FireProposed("a", t1, t1, "n"))
    run_to_end(w, "a", scheduled_run_id("a", t1), t1, code=1)
    assert w.jobs["spy"].upstream_outcomes == ()  # nothing of a's reached it

    # A placeholder upstream, then registered by another owner.
    w.apply(JobUpserted(spec("mine", schedule=None, depends_on=("x",)), T0))
    assert w.jobs["x"].dependents == ("mine",)  # a placeholder belongs to no one
    w.apply(JobUpserted(spec("x", owner="other"), T0 + 1))
    w.apply(FireProposed("x", t1, t1, "n"))
    run_to_end(w, "x", scheduled_run_id("x", t1), t1)
    assert w.jobs["mine"].upstream_outcomes == ()
    assert any("x belongs to owner 'other'" in r for r in w.rejections)
    # Its own owner's upstream still drives it.
    w.apply(JobUpserted(spec("b"), T0))
    w.apply(JobUpserted(spec("step", schedule=None, depends_on=("b",)), T0))
    assert w.jobs["b"].dependents == ("step",)
    w.apply(FireProposed("b", t1, t1, "n"))
    run_to_end(w, "b", scheduled_run_id("b", t1), t1)
    assert w.states(scheduled_run_id("step", t1)) == ["due"]


def test_a_pause_withdrawing_more_than_the_final_runs_kept_never_doubles_a_run() -> None:
    """A job every second with 40 runs decided ahead is paused: 40 firings withdrawn, more
    than the 20 final runs a job keeps. A resume before their times revives each of them
    (the same run, a new attempt); none is forgotten and created again under the same
    event ids (issue 35: duplicate runs, illegal transitions, double claims)."""
    w = registered(spec(every=S))
    start = T0 + 2 * S
    w.apply(FireProposed("j", start + 40 * S, start, "n"), now=start)
    ahead = [t for t in range(start + S, start + 41 * S, S)]
    assert all(w.states(scheduled_run_id("j", t))[-1] == "due" for t in ahead)
    w.apply(JobPaused("j", start), now=start)
    assert all(w.runs[scheduled_run_id("j", t)].reason == WITHDRAWN_BY_PAUSE for t in ahead)
    w.apply(JobResumed("j", start), now=start)
    w.apply(FireProposed("j", start + 40 * S, start, "n"), now=start)
    ids = [e.event_id for e in w.run_events()]
    assert len(ids) == len(set(ids)), "an event id written twice"
    for t in ahead:
        run_id = scheduled_run_id("j", t)
        assert w.states(run_id) == ["due", "cancelled", "due"]
        assert w.runs[run_id].attempt == 2  # revived: the withdrawn attempt is stale
    # Once their times have passed, withdrawn firings are forgotten like any final run.
    late = start + 60 * S
    for t in ahead:
        run_to_end(w, "j", scheduled_run_id("j", t), late, attempt=2)
    assert len(w.jobs["j"].final_runs) <= LedgerConfig().keep_final_runs


def test_a_one_off_moved_to_a_time_already_past_leaves_a_record() -> None:
    """A one-off at +10 min is moved, at +5 min, to +1 min: registered so it would run
    (or be recorded as skipped by its misfire policy); moved so, it must not vanish."""
    later, earlier = T0 + 10 * MIN, T0 + MIN
    w = registered(spec(schedule=AtSchedule(later)))
    now = T0 + 5 * MIN
    w.apply(JobUpserted(spec(schedule=AtSchedule(earlier)), now), now=now)
    assert w.jobs["j"].next_due_ms == earlier
    w.apply(FireProposed("j", earlier, now, "n"), now=now)
    states = w.states(scheduled_run_id("j", earlier))
    assert states in (["due"], ["skipped"])
    assert w.states(scheduled_run_id("j", later)) == []  # the old time is not fired


# -- catch-up work is bounded per input (issue 35) -----------------------------------------
def test_a_late_proposal_of_a_one_second_cron_evaluates_the_newest_times_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proposal a day late on `* * * * * *` used to enumerate the whole catch-up window
    twice (172,801 cron steps, ~2.4 s of the 2.5 s transaction budget) to keep its
    newest 1,000 times. The work now follows the runs decided, not the window."""
    from streams.core import schedule

    steps = 0
    real = schedule.cron_next_s

    def counted(*args: object) -> int | None:
        nonlocal steps
        steps += 1
        return real.__wrapped__(*args)

    monkeypatch.setattr(schedule, "cron_next_s", counted)
    every_second = CronSchedule("* * * * * *", "UTC")
    w = registered(spec(schedule=every_second, misfire="skip"))
    late = T0 + 30 * HOUR
    w.apply(FireProposed("j", T0 + S, late, "n"), now=late)
    decided = sorted({e.scheduled_ms for e in w.run_events()})
    assert len(decided) == LedgerConfig().max_catchup_runs  # the newest: run or skipped
    assert decided[-1] == late
    assert w.jobs["j"].fired_ms == late
    assert steps < 5 * LedgerConfig().max_catchup_runs, steps
