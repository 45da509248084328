"""Normal actions that broke a promise of docs/architecture.md (issue 52), each played
on the pure ledger (`World`) exactly as the issue found it: an upstream removed or added
within the lead, `max_runs` against a stop order that loses its race and against a
withdrawal repeated, and a parameter declared after a run was made."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from schemas.records import (
    BackfillRequested,
    ClaimRequested,
    DeadlineReached,
    FireProposed,
    JobDeleted,
    JobPaused,
    JobResumed,
    JobUpserted,
    RerunRequested,
    RunFinished,
    RunNowRequested,
    RunReleased,
    RunStarted,
)
from schemas.spec import AtSchedule, EverySchedule, Exclusion, JobSpec, Param
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.ledger import WITHDRAWN_BY_CHANGE, LedgerConfig
from streams.core.params import ENV_NAME
from tests.support.world import World

MINUTE = 60_000
HOUR = 60 * MINUTE
T0 = 1_800_000_000_000
T = T0 + 10 * MINUTE  # the firing every scenario plays around
LEAD = 10_000  # the scheduler's default lead: runs of `allow` jobs are decided this early


def spec(job_id: str, every: int = MINUTE, **changes: object) -> JobSpec:
    base = JobSpec(job_id=job_id, owner="o", schedule=EverySchedule(every), command=("true",))
    return replace(base, **changes)  # type: ignore[arg-type]


def world(*specs: JobSpec) -> World:
    w = World(config=LedgerConfig(claim_timeout_ms=5_000))
    for s in specs:
        w.apply(JobUpserted(s, T0), now=T0)
    return w


def fire(w: World, job_id: str, t: int, now: int) -> None:
    w.apply(FireProposed(job_id, t, now, "node"), now=now)


def execute(w: World, job_id: str, t: int, code: int, worker: str = "w1") -> None:
    """A worker claims the run of (job, t), starts it at its time and reports `code`."""
    run = w.runs[scheduled_run_id(job_id, t)]
    at = max(t, run.updated_ms)
    w.apply(ClaimRequested(job_id, run.run_id, run.attempt, worker, at), now=at)
    w.apply(RunStarted(job_id, run.run_id, run.attempt, worker, at), now=at)
    w.apply(RunFinished(job_id, run.run_id, run.attempt, worker, code, "", at + 1), now=at + 1)


def run_now(w: World, now: int) -> None:
    """A run-now of j, run at once by w1 to its end."""
    w.apply(RunNowRequested("j", "r1", now), now=now)
    manual = manual_run_id("j", "r1")
    w.apply(ClaimRequested("j", manual, 1, "w1", now), now=now)
    w.apply(RunStarted("j", manual, 1, "w1", now), now=now)
    w.apply(RunFinished("j", manual, 1, "w1", 0, "", now + 1), now=now + 1)


def started(w: World, job_id: str) -> set[str]:
    """The runs of the job a worker started (executed), whatever became of them."""
    return {e.run_id for e in w.run_events() if e.job_id == job_id and e.state == "running"}


# -- 2, 3: upstreams changed within the lead -----------------------------------------------


def test_removing_the_upstreams_within_the_lead_lets_the_firing_run() -> None:
    """D's run for T waits on U from T-10 s; its owner drops the dependency at T-3 s:
    the run must not wait 24 h to be skipped, it runs at its time."""
    w = world(spec("u"), spec("d", depends_on=("u",)))
    fire(w, "d", T, T - LEAD)
    run_id = scheduled_run_id("d", T)
    assert w.runs[run_id].state == "waiting"
    w.apply(JobUpserted(spec("d"), T - 3_000), now=T - 3_000)
    fire(w, "d", T, T - 2_000)  # decided again under the new upstreams (none)
    assert w.runs[run_id].state == "due"
    assert w.dispatch[-1].run_id == run_id


def test_a_run_still_waiting_past_its_time_is_freed_when_its_upstream_is_removed() -> None:
    """A run waiting for an upstream that is late: removing that upstream frees it at
    once (the upstream's notices no longer reach the job)."""
    w = world(spec("u"), spec("d", depends_on=("u",)))
    fire(w, "d", T, T)
    run_id = scheduled_run_id("d", T)
    assert w.runs[run_id].state == "waiting"
    w.apply(JobUpserted(spec("d"), T + 5_000), now=T + 5_000)
    assert w.runs[run_id].state == "due"


def test_adding_an_upstream_within_the_lead_gates_the_firing_decided_ahead() -> None:
    """D's run for T is due from T-10 s; at T-3 s D gains U; U's run for T fails: D's run
    for T must not run."""
    w = world(spec("u"), spec("d"))
    fire(w, "d", T, T - LEAD)
    run_id = scheduled_run_id("d", T)
    assert w.runs[run_id].state == "due"
    w.apply(JobUpserted(spec("d", depends_on=("u",)), T - 3_000), now=T - 3_000)
    assert w.runs[run_id].state == "cancelled"
    assert w.runs[run_id].reason == WITHDRAWN_BY_CHANGE
    fire(w, "d", T, T)  # decided again at its time: it waits on U now
    assert w.runs[run_id].state == "waiting"
    fire(w, "u", T, T)
    execute(w, "u", T, 1)
    assert w.runs[run_id].state == "skipped"
    assert w.runs[run_id].reason == "upstream u did not succeed"
    assert run_id not in started(w, "d")


# -- 4: max_runs ---------------------------------------------------------------------------


def claimed_ahead(w: World, t: int) -> str:
    """The run of j for t, decided ahead and claimed by w1 (to start at t)."""
    fire(w, "j", t, t - 60_000)
    run = w.runs[scheduled_run_id("j", t)]
    w.apply(ClaimRequested("j", run.run_id, run.attempt, "w1", t - 59_000), now=t - 59_000)
    assert w.runs[run.run_id].state == "dispatched"
    return run.run_id


def run_due(w: World, since: int, until: int) -> None:
    """The scheduler proposes each time the job says is due, at that time, and a worker
    runs every run it gets, until `until`."""
    now = since
    while (due := w.jobs["j"].next_due_ms) is not None and due <= until:
        now = max(now, due)
        fire(w, "j", due, now)
        run = w.runs.get(scheduled_run_id("j", due))
        if run is not None and run.state == "due":
            execute(w, "j", due, 0)


def test_a_run_started_against_its_stop_order_counts_for_max_runs() -> None:
    """max_runs 1, the run claimed ahead, the job paused 30 s before its time; the
    holder starts it anyway (the order lost the race); resume: nothing more runs."""
    w = world(spec("j", HOUR, max_runs=1))
    t = T0 + HOUR
    run_id = claimed_ahead(w, t)
    w.apply(JobPaused("j", t - 30_000), now=t - 30_000)
    w.apply(RunStarted("j", run_id, 1, "w1", t), now=t)
    w.apply(JobResumed("j", t + 60_000), now=t + 60_000)
    run_due(w, t + 60_000, t + 4 * HOUR)
    assert started(w, "j") == {run_id}
    assert w.jobs["j"].schedule_runs == 1
    assert w.jobs["j"].next_due_ms is None


def test_a_withdrawal_repeated_while_pending_gives_the_count_back_once() -> None:
    """max_runs 3: two runs done, the third claimed ahead, the job paused, its schedule
    changed while paused, the holder releases; resume: three executions in all."""
    w = world(spec("j", HOUR, max_runs=3))
    for k in (1, 2):
        fire(w, "j", T0 + k * HOUR, T0 + k * HOUR)
        execute(w, "j", T0 + k * HOUR, 0)
    third = T0 + 3 * HOUR
    run_id = claimed_ahead(w, third)
    w.apply(JobPaused("j", third - 30_000), now=third - 30_000)
    changed = spec("j", 11 * MINUTE, max_runs=3)  # `third` is not one of its times
    assert third % (11 * MINUTE)
    w.apply(JobUpserted(changed, third - 20_000), now=third - 20_000)
    w.apply(RunReleased("j", run_id, 1, "w1", "stopped", third - 10_000), now=third - 10_000)
    assert w.jobs["j"].schedule_runs == 2
    w.apply(JobResumed("j", third), now=third)
    run_due(w, third, third + 2 * HOUR)
    assert len(started(w, "j")) == 3
    assert w.jobs["j"].schedule_runs == 3


# -- 5: a parameter declared after the run was made ---------------------------------------

DAY = Param("day", "string")
WITH_DAY: dict[str, Any] = {
    "command": ("echo", "{day}"),
    "params": (DAY,),
    "params_in_command": True,
}


def literal(w: World, run_id: str, since: int) -> bool:
    """Whether a dispatch of the run since `since` left `{day}` unresolved or lacks the
    parameters."""
    return any(
        "{day}" in d.command or ENV_NAME not in dict(d.env)
        for d in w.dispatch
        if d.run_id == run_id and d.at_ms >= since
    )


def test_a_run_redispatched_after_a_required_parameter_was_added_fails_naming_it() -> None:
    w = world(spec("j", command=("echo", "{day}")))
    fire(w, "j", T, T - LEAD)
    run_id = scheduled_run_id("j", T)
    w.apply(JobUpserted(spec("j", **WITH_DAY), T - 5_000), now=T - 5_000)
    deadline = w.runs[run_id].deadline_ms
    assert deadline is not None
    w.apply(DeadlineReached("j", run_id, 1, "claim", deadline), now=deadline)
    run = w.runs[run_id]
    assert run.state == "failed"
    assert "params.day is required" in run.reason
    assert not literal(w, run_id, T - 5_000)


def test_a_rerun_of_a_run_made_before_a_required_parameter_is_refused() -> None:
    w = world(spec("j", command=("echo", "{day}")))
    fire(w, "j", T, T)
    execute(w, "j", T, 0)
    w.apply(JobUpserted(spec("j", **WITH_DAY), T + 5_000), now=T + 5_000)
    before = len(w.dispatch)
    w.apply(RerunRequested("j", scheduled_run_id("j", T), "r1", T + 6_000), now=T + 6_000)
    assert "params.day is required" in w.rejections[-1]
    assert len(w.dispatch) == before


def test_a_withdrawn_firing_is_not_revived_without_a_required_parameter_added_since() -> None:
    """Withdrawn by a pause, the declaration changed, resumed before its time: the firing
    is decided again and cannot run (no value), so it stays withdrawn, never dispatched."""
    w = world(spec("j", command=("echo", "{day}")))
    fire(w, "j", T, T - LEAD)
    run_id = scheduled_run_id("j", T)
    w.apply(JobPaused("j", T - 8_000), now=T - 8_000)
    assert w.runs[run_id].state == "cancelled"
    w.apply(JobUpserted(spec("j", **WITH_DAY), T - 7_000), now=T - 7_000)
    w.apply(JobResumed("j", T - 6_000), now=T - 6_000)
    fire(w, "j", T, T - 5_000)
    assert w.runs[run_id].state == "cancelled"
    assert not literal(w, run_id, T - 7_000)
    assert not [d for d in w.dispatch if d.run_id == run_id and d.at_ms >= T - 7_000]
    fire(w, "j", T + MINUTE, T + MINUTE)  # a new firing: recorded skipped, naming it
    later = w.runs[scheduled_run_id("j", T + MINUTE)]
    assert later.state == "skipped"
    assert "params.day is required" in later.reason


def test_a_default_declared_later_reaches_the_redispatch() -> None:
    """A parameter added with a default: the redispatch carries the default in its argv
    and environment (the run's own values are kept, the new default completes them)."""
    w = world(spec("j", command=("echo", "{day}")))
    fire(w, "j", T, T - LEAD)
    run_id = scheduled_run_id("j", T)
    with_default = {**WITH_DAY, "params": (Param("day", "string", '"mon"'),)}
    w.apply(JobUpserted(spec("j", **with_default), T - 5_000), now=T - 5_000)
    deadline = w.runs[run_id].deadline_ms
    assert deadline is not None
    w.apply(DeadlineReached("j", run_id, 1, "claim", deadline), now=deadline)
    last = w.dispatch[-1]
    assert last.run_id == run_id
    assert last.command == ("echo", "mon")
    assert '"day"' in dict(last.env)[ENV_NAME]


# -- found by the simulation once it generated the whole spec ------------------------------


def created(w: World, run_id: str) -> int:
    """How many times the run was created (a first event: seq 0 or 1, attempt 1)."""
    return sum(
        1
        for e in w.run_events()
        if e.run_id == run_id and e.event_id.rsplit("#", 1)[1] in ("0", "1")
    )


def test_a_past_one_off_is_never_backfilled_again_after_a_delete() -> None:
    """A one-off registered just after its time runs (misfire policy); deleted (its run
    forgotten) and re-created, a backfill over that time must not create it again."""
    once = T0 - 1_000
    w = World()
    w.apply(JobUpserted(spec("j", schedule=AtSchedule(once)), T0), now=T0)
    fire(w, "j", once, T0 + 10)
    run_id = scheduled_run_id("j", once)
    execute(w, "j", once, 0)
    w.apply(JobDeleted("j", T0 + MINUTE), now=T0 + MINUTE)
    assert run_id not in w.runs  # forgotten with the deleted job's final runs
    w.apply(JobUpserted(spec("j", schedule=AtSchedule(once)), T0 + 2 * MINUTE))
    w.apply(BackfillRequested("j", once - HOUR, once + HOUR, T0 + 3 * MINUTE, "b1"))
    assert created(w, run_id) == 1


def test_a_one_off_moved_back_to_a_decided_time_is_not_run_again() -> None:
    """A job ran at t; re-timed to a one-off at t (already past, its run known): the run
    of t stays the one run of it, even once it is forgotten (here by a run-now's end,
    one final run kept) before the one-off is proposed."""
    w = World(config=LedgerConfig(keep_final_runs=1))
    w.apply(JobUpserted(spec("j"), T0), now=T0)
    fire(w, "j", T, T)
    execute(w, "j", T, 0)
    run_id = scheduled_run_id("j", T)
    w.apply(JobUpserted(spec("j", schedule=AtSchedule(T)), T + 30_000), now=T + 30_000)
    run_now(w, T + 35_000)  # its end forgets the oldest final run
    assert run_id not in w.runs  # forgotten
    fire(w, "j", T, T + 60_000)
    assert created(w, run_id) == 1


def test_a_change_of_max_runs_does_not_swallow_a_firing_due_before_it() -> None:
    """The firing at T is due but not proposed yet when max_runs is set (below the runs
    made so far) just after T: it was due under the old spec and is decided."""
    w = world(spec("j"))
    for k in (1, 2, 3):
        fire(w, "j", T - k * MINUTE, T - k * MINUTE)
    w.apply(JobUpserted(spec("j", max_runs=2), T + 1_000), now=T + 1_000)
    assert w.runs[scheduled_run_id("j", T)].state == "due"
    fire(w, "j", T + MINUTE, T + MINUTE)
    assert scheduled_run_id("j", T + MINUTE) not in w.runs


def test_a_firing_lacking_a_required_value_is_skipped_at_creation_and_not_counted() -> None:
    w = world(spec("j", max_runs=1, **WITH_DAY))
    fire(w, "j", T, T)
    run_id = scheduled_run_id("j", T)
    assert [e.event_id for e in w.run_events(run_id)] == [f"{run_id}#0"]
    assert w.runs[run_id].state == "skipped"
    assert w.jobs["j"].schedule_runs == 0


def test_a_withdrawal_its_holder_answered_by_starting_is_never_decided_again() -> None:
    """Claimed ahead, the job paused (the watermark goes back below T), the holder starts
    it anyway; the run is forgotten neither by later runs' ends (one final run kept) nor
    decided again by a resume that runs every firing the pause covered."""
    w = World(config=LedgerConfig(keep_final_runs=1))
    w.apply(JobUpserted(spec("j"), T0), now=T0)
    fire(w, "j", T, T - LEAD)
    run_id = scheduled_run_id("j", T)
    w.apply(ClaimRequested("j", run_id, 1, "w1", T - 9_000), now=T - 9_000)
    w.apply(JobPaused("j", T - 5_000), now=T - 5_000)
    w.apply(RunStarted("j", run_id, 1, "w1", T), now=T)
    assert w.runs[run_id].reason.endswith("(it had started)")
    run_now(w, T + 10_000)  # its end forgets the oldest final run
    w.apply(JobResumed("j", T + 2 * MINUTE, "all"), now=T + 2 * MINUTE)
    assert created(w, run_id) == 1


def test_a_late_change_never_decides_again_a_firing_whose_run_was_forgotten() -> None:
    """T is decided (skipped by a calendar), then later firings push its run out of the
    final runs kept (four); a change effective before T, arriving late, must not move the
    watermark back below T: its run would be made a second time (simulation seed 6267)."""
    w = World(config=LedgerConfig(keep_final_runs=4))
    day = Exclusion("freeze", "2027-01-15", "2027-01-15")  # T's day, in UTC
    w.apply(JobUpserted(spec("j", exclude=(day,)), T - 30_000), now=T - 30_000)
    for k in range(6):
        fire(w, "j", T + k * MINUTE, T + k * MINUTE)
    run_id = scheduled_run_id("j", T)
    assert run_id not in w.runs  # forgotten: five final runs since
    late = T + 5 * MINUTE + 1_000
    w.apply(JobUpserted(spec("j", 2 * MINUTE, exclude=(day,)), T - 5_000), now=late)
    fire(w, "j", T, late)
    assert created(w, run_id) == 1
    assert w.jobs["j"].forgotten_ms >= T


def test_a_re_created_job_fires_its_own_times_after_an_old_firing_decided_ahead() -> None:
    """Every 2 s, 184 s decided ahead (skipped by a calendar); deleted and re-created at
    182.2 s every 3 s: the new life's 183 s is due (the old life's decision for a later
    time does not swallow it), and 184 s keeps its one record (simulation seed 11936)."""
    day = Exclusion("freeze", "2027-01-15", "2027-01-15")
    w = World(config=LedgerConfig(keep_final_runs=4))
    base = T0 + 170_000
    w.apply(JobUpserted(spec("j", 2_000, exclude=(day,)), base), now=base)
    for t in range(base + 2_000, base + 16_000, 2_000):
        fire(w, "j", t, t - 1_800)  # each decided ahead of its time: skipped
    gone = base + 12_188
    w.apply(JobDeleted("j", gone), now=gone)
    w.apply(JobUpserted(spec("j", 3_000), gone), now=gone)
    fire(w, "j", base + 13_000, base + 13_000)
    assert w.runs[scheduled_run_id("j", base + 13_000)].state == "due"
    assert created(w, scheduled_run_id("j", base + 14_000)) == 1


def test_a_past_one_off_re_created_twice_runs_once() -> None:
    """A one-off runs; deleted (its run forgotten) and re-created twice: the firing whose
    run was forgotten is never decided again (its floor survives every re-creation:
    loop seed 20 of the simulation)."""
    once = T0 + 4_513
    w = World()
    w.apply(JobUpserted(spec("j", schedule=AtSchedule(once)), T0), now=T0)
    fire(w, "j", once, once)
    execute(w, "j", once, 0)
    run_id = scheduled_run_id("j", once)
    for k in (1, 2):
        w.apply(JobDeleted("j", once + k * MINUTE), now=once + k * MINUTE)
        w.apply(JobUpserted(spec("j", schedule=AtSchedule(once)), once + k * MINUTE + 1))
        fire(w, "j", once, once + k * MINUTE + 2)
    assert created(w, run_id) == 1
