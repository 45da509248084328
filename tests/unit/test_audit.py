"""The audit checker (connectors/audit/checker.py), pure: histories with fake offsets.

Clean histories come from the real ledger (tests/support/world.py), so the checker is
held to what the ledger actually writes: pre-dispatch, pause and resume, misfire skips,
retries, reruns, schedule changes, a catch-up beyond the 24 h window, deletion.
Violations are injected into them, or built by hand.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import replace

import pytest

from connectors.audit.checker import (
    TRANSITIONS,
    AuditConfig,
    Auditor,
    AuditReport,
    allowance_ms,
    audit,
    format_report,
)
from schemas.records import (
    BackfillRequested,
    CancelRequested,
    ClaimRequested,
    DeadlineReached,
    FireProposed,
    JobDeleted,
    JobEvent,
    JobPaused,
    JobResumed,
    JobUpserted,
    LedgerInput,
    RerunRequested,
    RunEvent,
    RunFinished,
    RunReleased,
    RunStarted,
    RunStateName,
    Trigger,
    WorkerLost,
)
from schemas.spec import CronSchedule, EverySchedule, JobSpec, RetryPolicy
from streams.core.ids import iso_utc, scheduled_run_id
from tests.support.world import World

T0 = 1_800_000_000_000  # a multiple of 60 s
SEC = 1_000
MIN = 60_000
HOUR = 60 * MIN

Event = RunEvent | JobEvent


def spec(job_id: str = "j", **changes: object) -> JobSpec:
    base = JobSpec(
        job_id=job_id,
        owner="o",
        schedule=EverySchedule(MIN),
        command=("true",),
        timeout_s=60,
        retry=RetryPolicy(max_attempts=2, backoff_s=5),
        idempotent=True,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def rid(t: int, job: str = "j") -> str:
    return scheduled_run_id(job, t)


class Ledger:
    """Drives the real ledger through typical lives of runs, keeping the worker reports
    it was sent (as they would be on job-log)."""

    def __init__(self, base: int = T0) -> None:
        self.w = World()
        self.base = base
        self.reports: list[LedgerInput] = []

    def report(self, inp: LedgerInput) -> str:
        """A worker's record to job-log; returns the ledger's rejection ("" if none)."""
        self.reports.append(inp)
        return self.w.apply(inp).rejected

    def at(self, minutes: float) -> int:
        return self.base + int(minutes * MIN)

    def register(self, job_spec: JobSpec, at: int) -> None:
        self.w.apply(JobUpserted(job_spec, at))

    def fire(self, job: str, t: int, at: int | None = None) -> None:
        """Proposed 10 s early (pre-dispatch), unless `at` says otherwise."""
        self.w.apply(FireProposed(job, t, t - 10_000 if at is None else at, "node-a"))

    def execute(self, job: str, t: int, attempt: int = 1, exit_code: int = 0) -> None:
        """Claim, start (300 ms late) and finish the current attempt of the run for t."""
        run = self.w.runs[rid(t, job)]
        assert run.state == "due", run
        begin = max(t, run.updated_ms)
        self.report(ClaimRequested(job, run.run_id, attempt, "w1", begin - 5_000))
        self.report(RunStarted(job, run.run_id, attempt, "w1", begin + 300))
        self.report(RunFinished(job, run.run_id, attempt, "w1", exit_code, "", begin + 2_000))

    def cycle(self, job: str, t: int) -> None:
        self.fire(job, t)
        self.execute(job, t)

    def events(self) -> list[Event]:
        return list(self.w.events)


def clean_history(base: int = T0) -> list[Event]:
    """Two jobs over ~2 h: every-minute j with pre-dispatch, a pause that cancels a run
    created ahead, a resume, a retry, a rerun, a misfire catch-up with skips, a schedule
    change, deletion; and a cron job k in a zone. `base`: a multiple of 10 minutes, so
    that the schedules (every 2 min, */5 min) fire at the minutes used here."""
    return clean_ledger(base).events()


def clean_ledger(base: int = T0) -> Ledger:
    """The ledger of `clean_history`, with the worker reports it was sent."""
    assert base % (10 * MIN) == 0, base
    led = Ledger(base)
    at = led.at
    led.register(spec(), at(0))
    led.register(spec("k", schedule=CronSchedule("*/5 * * * *", "Europe/Berlin")), at(0) + 7)
    for minute in range(1, 6):
        led.cycle("j", at(minute))
    # Created ahead for minute 6, then the pause 5 s before it cancels it.
    led.fire("j", at(6))
    led.w.apply(JobPaused("j", at(6) - 5_000))
    assert led.w.runs[rid(at(6))].state == "cancelled"
    led.w.apply(JobResumed("j", at(15) + 20_000))  # next due: minute 16
    # Minute 16 fails once, is retried after the backoff and succeeds.
    led.fire("j", at(16))
    led.execute("j", at(16), exit_code=1)
    retrying = led.w.runs[rid(at(16))]
    assert retrying.state == "retrying"
    assert retrying.deadline_ms is not None
    led.w.apply(DeadlineReached("j", retrying.run_id, 1, "retry", retrying.deadline_ms))
    led.execute("j", at(16), attempt=2)
    for minute in range(17, 21):
        led.cycle("j", at(minute))
    # A rerun of minute 17 (a new attempt of the same run).
    led.w.apply(RerunRequested("j", rid(at(17)), "again-1", at(21) - 1_000))
    rerun = led.w.runs[rid(at(17))]
    assert rerun.state == "due"
    assert rerun.attempt == 2
    led.execute("j", at(17), attempt=2)
    # The scheduler is away from minute 21 to 30: a late proposal skips 21..29 (misfire).
    led.fire("j", at(21), at=at(30) + 30_000)
    assert led.w.runs[rid(at(25))].state == "skipped"
    led.execute("j", at(30))
    for minute in range(31, 41):
        led.cycle("j", at(minute))
    # From minute 40 on j fires every 2 minutes.
    led.register(spec(schedule=EverySchedule(2 * MIN)), at(40) + 30_000)
    for minute in range(42, 121, 2):
        led.cycle("j", at(minute))
    led.w.apply(JobDeleted("j", at(121)))
    for minute in range(5, 131, 5):
        led.cycle("k", at(minute))
    return led


def located(events: list[Event]) -> list[tuple[Event, int, int]]:
    """Fake Kafka positions: all in partition 0, offsets in list order."""
    return [(event, 0, offset) for offset, event in enumerate(events)]


DEFAULT = AuditConfig()


def check(
    events: list[Event], config: AuditConfig = DEFAULT, now_ms: int | None = None
) -> AuditReport:
    return audit(located(events), config, now_ms)


def kinds(report: AuditReport) -> dict[str, int]:
    return {kind: n for kind, n in report.counts.items() if n}


def run_event(
    t: int,
    seq: int,
    state: RunStateName,
    at: int,
    attempt: int = 1,
    job: str = "j",
    trigger: Trigger = "schedule",
    worker: str = "",
) -> RunEvent:
    run_id = rid(t, job)
    return RunEvent(f"{run_id}#{seq}", job, run_id, t, trigger, attempt, state, at, worker, "")


def job_event(kind: str, at: int, job_spec: JobSpec | None = None, job: str = "j") -> JobEvent:
    return JobEvent(f"{job}#job#{at}", job, kind, at, job_spec)  # type: ignore[arg-type]


def life(t: int, job: str = "j") -> list[RunEvent]:
    """A run that goes due, dispatched, running, succeeded."""
    return [
        run_event(t, 1, "due", t - 10_000, job=job),
        run_event(t, 2, "dispatched", t - 9_000, job=job, worker="w"),
        run_event(t, 3, "running", t + 500, job=job, worker="w"),
        run_event(t, 4, "succeeded", t + 2_000, job=job, worker="w"),
    ]


def simple_history(minutes: int = 10, job: str = "j") -> list[Event]:
    events: list[Event] = [job_event("upserted", T0, spec(job), job=job)]
    for k in range(1, minutes + 1):
        events.extend(life(T0 + k * MIN, job))
    return events


# -- clean histories ----------------------------------------------------------------------
def test_a_clean_ledger_history_passes() -> None:
    events = clean_history()
    report = check(events)
    assert report.clean, report.violations[:5]
    assert report.jobs == 2
    assert report.events == len(events)
    assert report.live_runs == 0
    skipped = [e for e in events if isinstance(e, RunEvent) and e.state == "skipped"]
    assert len(skipped) == 9
    assert report.expected_firings == 95
    assert report.lateness.count == 87  # first attempts (not the retry, not the rerun)
    assert report.lateness.p50_ms == 300


def test_the_clean_history_really_has_the_interesting_transitions() -> None:
    states = {
        (e.state, e.reason.split(" ")[0])
        for e in clean_history()
        if isinstance(e, RunEvent) and e.state in ("cancelled", "retrying", "skipped", "due")
    }
    assert ("cancelled", "job") in states  # paused before the run was due
    assert ("retrying", "exit") in states
    assert ("skipped", "misfire") in states
    assert ("due", "rerun") in states
    assert ("due", "retry") in states


def test_runs_of_a_job_in_progress_at_the_end_are_fine() -> None:
    events = simple_history(5)
    t = T0 + 6 * MIN
    events += [run_event(t, 1, "due", t - 10_000), run_event(t, 2, "dispatched", t - 9_000)]
    report = check(events)
    assert report.clean
    assert report.live_runs == 1


def test_firings_in_the_safety_margin_are_not_yet_missing() -> None:
    events = simple_history(5)
    # The newest event is 100 s after the 5th run: the 6th firing (60 s after it) is
    # inside the 120 s margin.
    report = check(events, now_ms=T0 + 5 * MIN + 100_000)
    assert report.clean
    late = check(events, now_ms=T0 + 5 * MIN + 190_000)
    assert kinds(late) == {"missing_firing": 1}


def test_a_catch_up_beyond_the_24_h_window_is_excused() -> None:
    led = Ledger()
    led.register(spec(schedule=EverySchedule(HOUR), misfire="skip"), T0)
    led.cycle("j", T0 + HOUR)
    # Nobody proposed for 30 hours: the ledger skips the last 24 h and forgets the rest.
    led.fire("j", T0 + 2 * HOUR, at=T0 + 31 * HOUR + 30_000)
    led.execute("j", T0 + 31 * HOUR)
    report = check(led.events())
    assert report.clean, report.violations[:3]
    assert report.excused_firings == 6  # hours 2..7: older than 24 h before the proposal


def test_an_oversized_catch_up_is_excused() -> None:
    """A late decision records at most max_catchup_runs firings (the newest ones); the
    older undecided ones may go without a record."""
    second = 1_000
    events: list[Event] = [job_event("upserted", T0, spec(schedule=EverySchedule(second)))]
    decided_at = T0 + 1_500 * second + 100
    events += [run_event(T0 + k * second, 0, "skipped", decided_at) for k in range(501, 1_501)]
    report = check(events, now_ms=decided_at)
    assert report.clean, report.violations[:3]
    assert report.excused_firings == 500  # seconds 1..500
    smaller = check(events, AuditConfig(max_catchup_runs=1_001), now_ms=decided_at)
    assert kinds(smaller) == {"missing_firing": 500}


def test_the_ledger_records_the_newest_firings_of_an_oversized_catch_up() -> None:
    led = Ledger()
    led.register(spec(schedule=EverySchedule(1_000), misfire="skip"), T0)
    led.fire("j", T0 + 1_000, at=T0 + 1_500 * 1_000)  # 1,500 missed seconds
    report = check(led.events(), now_ms=T0 + 1_500 * 1_000)
    assert report.counts["missing_firing"] == 0, report.violations[:2]


def test_a_backfill_after_re_registration_creates_no_second_run() -> None:
    led = Ledger()
    led.register(spec(), T0)
    for minute in range(1, 31):
        led.cycle("j", T0 + minute * MIN)
    led.w.apply(JobDeleted("j", T0 + 31 * MIN))
    led.register(spec(), T0 + 40 * MIN)
    led.w.apply(BackfillRequested("j", T0, T0 + 35 * MIN, T0 + 41 * MIN))
    report = check(led.events(), now_ms=T0 + 42 * MIN)
    assert report.counts["duplicate_run"] == 0, report.violations[:2]


def test_a_re_registered_job_fires_again_only_after_its_new_registration() -> None:
    events = simple_history(3)
    events.append(job_event("deleted", T0 + 3 * MIN + 10_000))
    events.append(job_event("upserted", T0 + 10 * MIN + 5_000, spec()))
    events.extend(life(T0 + 11 * MIN))
    assert check(events).clean


def test_runs_of_a_windowed_replay_may_begin_mid_life() -> None:
    events: list[Event] = list(life(T0 + MIN)[2:])
    assert kinds(check(events)) == {"illegal_transition": 1}
    report = check(events, AuditConfig(partial=True))
    assert report.clean
    assert report.unchecked_jobs == 1  # its registration is not in the window


def test_a_job_deleted_while_paused_and_registered_again() -> None:
    events = simple_history(3)
    events.append(job_event("paused", T0 + 3 * MIN + 10_000))
    events.append(job_event("deleted", T0 + 5 * MIN))
    events.append(job_event("resumed", T0 + 6 * MIN))  # ignored: the job is deleted
    events.append(job_event("upserted", T0 + 9 * MIN + 30_000, spec()))
    for minute in range(10, 15):
        events.extend(life(T0 + minute * MIN))
    assert check(events).clean


# -- violations -----------------------------------------------------------------------------
def test_a_repeated_creation_is_a_duplicate_run() -> None:
    events = clean_history()
    first = next(e for e in events if isinstance(e, RunEvent) and e.run_id == rid(T0 + 3 * MIN))
    events.append(replace(first, at_ms=first.at_ms + 2 * HOUR))
    report = check(events)
    assert kinds(report) == {"duplicate_run": 1}
    (v,) = report.violations
    assert (v.run_id, v.partition, v.offset) == (first.run_id, 0, len(events) - 1)


def test_a_skipped_firing_that_is_then_created_is_a_duplicate_run() -> None:
    events = simple_history(3)
    t = T0 + 4 * MIN
    events += [run_event(t, 0, "skipped", t + 61_000), run_event(t, 1, "due", t + 62_000)]
    assert kinds(check(events)) == {"duplicate_run": 1}


def test_two_run_ids_for_one_firing_are_a_duplicate_run() -> None:
    events = simple_history(3)
    t = T0 + 2 * MIN
    other = "j@second-id"
    events.append(RunEvent(f"{other}#1", "j", other, t, "schedule", 1, "due", t, "", ""))
    report = check(events)
    assert kinds(report)["duplicate_run"] == 1
    assert report.of_kind("duplicate_run")[0].run_id == other


def test_a_repeated_seq_is_a_duplicate_run() -> None:
    events = simple_history(3)
    events.append(life(T0 + 2 * MIN)[3])  # "succeeded" once more
    assert kinds(check(events)) == {"duplicate_run": 1}


def test_a_missing_firing_is_reported_at_the_next_decision() -> None:
    events = [
        e
        for e in clean_history()
        if not (isinstance(e, RunEvent) and e.run_id == rid(T0 + 33 * MIN))
    ]
    located_events = located(events)
    report = audit(located_events)
    assert kinds(report) == {"missing_firing": 1}
    (v,) = report.violations
    assert v.job_id == "j"
    assert "08:33:00Z" in v.detail  # T0 + 33 min
    next_creation = next(
        (p, o)
        for e, p, o in located_events
        if isinstance(e, RunEvent) and e.event_id == f"{rid(T0 + 34 * MIN)}#1"
    )
    assert (v.partition, v.offset) == next_creation


def test_a_job_that_stopped_firing_is_reported_at_its_last_event() -> None:
    events = simple_history(5)
    events.append(life(T0 + 20 * MIN, "other")[0])  # time moves on elsewhere
    report = check(events)
    # Minutes 6..17 were due (18 and later are inside the 120 s margin of minute 20 - 10 s).
    assert report.counts["missing_firing"] == 12
    assert {v.offset for v in report.of_kind("missing_firing")} == {len(events) - 2}


def test_no_firing_is_expected_while_paused_but_after_the_resume() -> None:
    events = simple_history(3)
    events.append(job_event("paused", T0 + 3 * MIN + 1))
    events.append(job_event("resumed", T0 + 8 * MIN + 30_000))
    for minute in range(10, 15):  # minute 9 is missing
        events.extend(life(T0 + minute * MIN))
    report = check(events)
    assert kinds(report) == {"missing_firing": 1}
    assert "08:09:00Z" in report.violations[0].detail  # T0 + 9 min


def test_a_schedule_change_applies_from_its_time() -> None:
    events = simple_history(3)
    events.append(
        job_event("upserted", T0 + 3 * MIN + 30_000, spec(schedule=EverySchedule(5 * MIN)))
    )
    events.extend(life(T0 + 5 * MIN))
    events.extend(life(T0 + 10 * MIN))
    assert check(events).clean
    events.extend(life(T0 + 20 * MIN))  # minute 15 of the new schedule is missing
    assert kinds(check(events)) == {"missing_firing": 1}


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        # due -> running (no claim)
        (lambda t: [run_event(t, 1, "due", t), run_event(t, 2, "running", t)], "not a legal"),
        # a seq gap
        (lambda t: [run_event(t, 1, "due", t), run_event(t, 3, "dispatched", t)], "seq gap"),
        # out of order: seq 3 then seq 2
        (
            lambda t: [
                run_event(t, 1, "due", t),
                run_event(t, 3, "dispatched", t),
                run_event(t, 2, "cancelled", t),
            ],
            "out-of-order",
        ),
        # a retry that keeps the attempt number
        (
            lambda t: [
                run_event(t, 1, "due", t),
                run_event(t, 2, "dispatched", t),
                run_event(t, 3, "retrying", t),
                run_event(t, 4, "due", t, attempt=1),
            ],
            "expected 2",
        ),
        # a run that begins running
        (lambda t: [run_event(t, 1, "running", t)], "first event"),
        # a skip with seq 1
        (lambda t: [run_event(t, 1, "skipped", t)], "first event"),
        # a final run that moves on without a rerun
        (lambda t: [*life(t), run_event(t, 5, "failed", t, worker="w")], "not a legal"),
    ],
    ids=[
        "no-claim",
        "seq-gap",
        "out-of-order",
        "retry-attempt",
        "begins-running",
        "skip-seq-1",
        "after-final",
    ],
)
def test_illegal_transitions(mutate: object, expected: str) -> None:
    assert callable(mutate)
    events = simple_history(3)
    t = T0 + 4 * MIN
    events.extend(mutate(t))
    report = check(events, now_ms=t + MIN)
    assert report.counts["illegal_transition"] >= 1, report.violations
    assert any(expected in v.detail for v in report.of_kind("illegal_transition"))
    assert set(kinds(report)) == {"illegal_transition"}


def test_a_malformed_event_id_is_an_illegal_transition() -> None:
    events = simple_history(3)
    bad = replace(life(T0 + 4 * MIN)[0], event_id="j@whatever#x")
    events.append(bad)
    report = check(events, now_ms=T0 + 4 * MIN)
    assert kinds(report) == {"illegal_transition": 1}
    assert "malformed" in report.violations[0].detail


_PATHS: dict[str, list[RunStateName]] = {
    "waiting": ["waiting"],
    "due": ["due"],
    "dispatched": ["due", "dispatched"],
    "running": ["due", "dispatched", "running"],
    "retrying": ["due", "dispatched", "retrying"],
    "succeeded": ["due", "dispatched", "succeeded"],
    "failed": ["due", "failed"],
    "cancelled": ["due", "cancelled"],
    "skipped": ["skipped"],
}


@pytest.mark.parametrize(
    ("source", "target"),
    [(source, target) for source, targets in TRANSITIONS.items() for target in sorted(targets)],
)
def test_every_transition_of_the_table_is_legal(source: str | None, target: str) -> None:
    t = T0 + MIN
    path: list[RunStateName] = [*(_PATHS[source] if source is not None else []), target]  # type: ignore[list-item]
    seq = 0 if path[0] == "skipped" else 1
    attempt = 1
    auditor = Auditor()
    for offset, state in enumerate(path):
        if (
            offset
            and state in ("due", "waiting")
            and path[offset - 1] not in ("waiting", "dispatched")
        ):
            attempt += 1  # a retry, a rerun, a revival (a claim released keeps its attempt)
        auditor.record(run_event(t, seq, state, t, attempt=attempt), 0, offset)
        seq += 1
    report = auditor.finish(now_ms=t)
    assert report.clean, report.violations


def test_a_second_claim_of_an_attempt_is_a_double_claim() -> None:
    events = simple_history(3)
    t = T0 + 2 * MIN
    events.append(run_event(t, 2, "dispatched", t - 8_000, worker="zombie"))
    report = check(events)
    assert kinds(report) == {"double_claim": 1}
    assert report.violations[0].offset == len(events) - 1


def released(t: int) -> list[RunEvent]:
    """A run claimed ahead by w1, released before its start, claimed again by w2."""
    return [
        run_event(t, 1, "due", t - 45_000),
        run_event(t, 2, "dispatched", t - 44_000, worker="w1"),
        run_event(t, 3, "due", t - 20_000),
        run_event(t, 4, "dispatched", t - 19_000, worker="w2"),
        run_event(t, 5, "running", t + 300, worker="w2"),
        run_event(t, 6, "succeeded", t + 2_000, worker="w2"),
    ]


def test_a_claim_released_before_the_start_may_be_claimed_again() -> None:
    events = simple_history(3)
    t = T0 + 4 * MIN
    events.extend(released(t))
    report = check(events, now_ms=t + MIN)
    assert report.clean, report.violations
    assert report.lateness.count == 4  # the released run's start counts once


def test_a_claim_released_is_claimed_once_more_then_a_third_is_a_double_claim() -> None:
    events = simple_history(3)
    t = T0 + 4 * MIN
    life_ = released(t)
    events.extend(life_[:4])
    events.append(run_event(t, 5, "dispatched", t - 18_000, worker="zombie"))
    report = check(events, now_ms=t + MIN)
    assert kinds(report) == {"double_claim": 1}
    assert report.violations[0].offset == len(events) - 1


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        # a claim released with a new attempt number: a release keeps the attempt
        (
            lambda t: [
                run_event(t, 1, "due", t),
                run_event(t, 2, "dispatched", t, worker="w1"),
                run_event(t, 3, "due", t, attempt=2),
            ],
            "dispatched -> due with attempt 2, expected 1",
        ),
        # a started attempt is never released
        (
            lambda t: [
                run_event(t, 1, "due", t),
                run_event(t, 2, "dispatched", t, worker="w1"),
                run_event(t, 3, "running", t, worker="w1"),
                run_event(t, 4, "due", t),
            ],
            "running -> due is not a legal transition",
        ),
    ],
    ids=["new-attempt", "after-start"],
)
def test_illegal_releases(events: object, expected: str) -> None:
    assert callable(events)
    history = simple_history(3)
    t = T0 + 4 * MIN
    history.extend(events(t))
    report = check(history, now_ms=t + MIN)
    assert set(kinds(report)) == {"illegal_transition"}, report.violations
    assert any(expected in v.detail for v in report.of_kind("illegal_transition"))


def test_a_start_after_a_release_is_still_one_start() -> None:
    events = simple_history(3)
    t = T0 + 4 * MIN
    events.extend(released(t)[:5])
    events.append(run_event(t, 6, "running", t + 400, worker="w1"))
    report = check(events, now_ms=t + MIN)
    assert kinds(report) == {"double_start": 1}


def test_each_release_extends_the_allowance_by_one_attempt() -> None:
    base = spec(timeout_s=100, retry=RetryPolicy(max_attempts=3, backoff_s=10, max_backoff_s=15))
    assert allowance_ms(base, released=2) == allowance_ms(base) + 2 * 160_000
    events = simple_history(2)
    t = T0 + 3 * MIN
    events += released(t)[:3]  # released, then never claimed again
    allowed = allowance_ms(spec(), released=1)
    assert check(events, now_ms=t + allowed - 1).counts["not_final"] == 0
    report = check(events, AuditConfig(safety_margin_ms=10**12), now_ms=t + allowed + 1)
    assert kinds(report) == {"not_final": 1}


def test_a_second_start_of_an_attempt_is_a_double_start() -> None:
    events = simple_history(3)
    t = T0 + 2 * MIN
    events.append(run_event(t, 5, "running", t + 3_000, worker="w2"))
    report = check(events)
    assert kinds(report) == {"double_start": 1}
    assert report.violations[0].run_id == rid(t)


def test_a_second_attempt_may_start_once_more() -> None:
    events = simple_history(1)
    t = T0 + MIN
    events += [
        run_event(t, 5, "due", t + 5_000, attempt=2),
        run_event(t, 6, "dispatched", t + 6_000, attempt=2),
        run_event(t, 7, "running", t + 7_000, attempt=2),
        run_event(t, 8, "succeeded", t + 8_000, attempt=2),
    ]
    assert check(events, now_ms=t + MIN).clean


def test_a_run_that_never_ends_is_not_final() -> None:
    events = simple_history(2)
    t = T0 + 3 * MIN
    events += [run_event(t, 1, "due", t - 10_000), run_event(t, 2, "dispatched", t - 9_000)]
    allowed = allowance_ms(spec())
    assert check(events, now_ms=t + allowed - 1).counts["not_final"] == 0
    report = check(events, AuditConfig(safety_margin_ms=10**12), now_ms=t + allowed + 1)
    assert kinds(report) == {"not_final": 1}
    (v,) = report.violations
    assert (v.run_id, v.offset) == (rid(t), len(events) - 1)
    assert "still dispatched" in v.detail


def test_the_allowance_covers_attempts_backoff_and_dependencies() -> None:
    base = spec(timeout_s=100, retry=RetryPolicy(max_attempts=3, backoff_s=10, max_backoff_s=15))
    # 3 x (100 s + 30 s + 30 s) + 2 x (10 s + 15 s) + 10 min
    assert allowance_ms(base) == 3 * 160_000 + 50_000 + 600_000
    assert allowance_ms(replace(base, depends_on=("up",))) == allowance_ms(base) + 24 * HOUR


def test_a_run_of_an_unknown_job_gets_the_fallback_allowance() -> None:
    t = T0
    events: list[Event] = [run_event(t, 1, "due", t)]
    assert check(events, now_ms=t + 24 * HOUR).clean
    assert kinds(check(events, AuditConfig(safety_margin_ms=0), now_ms=t + 25 * HOUR)) == {
        "not_final": 1
    }


def test_undecodable_records_are_counted_and_reported() -> None:
    auditor = Auditor()
    for event, p, o in located(simple_history(2)):
        auditor.record(event, p, o)
    auditor.undecodable(0, 42, "not Avro", b"j")
    report = auditor.finish()
    assert report.undecodable == 1
    assert kinds(report) == {"undecodable": 1}
    assert (report.violations[0].offset, report.violations[0].job_id) == (42, "j")


def test_an_auditor_finishes_once() -> None:
    auditor = Auditor()
    auditor.finish()
    with pytest.raises(RuntimeError, match="once"):
        auditor.finish()


def test_violations_are_counted_beyond_those_kept() -> None:
    events = simple_history(1)
    events.append(job_event("upserted", T0 + 3 * HOUR, spec("x"), job="x"))
    report = check(events, AuditConfig(keep_violations=3))
    assert report.counts["missing_firing"] > 100
    assert len(report.violations) == 3


# -- the text -------------------------------------------------------------------------------
def test_the_report_shows_counts_lateness_and_the_first_violations() -> None:
    events = clean_history()
    events.append(replace(life(T0 + 2 * MIN)[2], event_id=f"{rid(T0 + 2 * MIN)}#5"))
    report = check(events)
    out = io.StringIO()
    format_report(report, out, topic="x.run-events")
    text = out.getvalue()
    assert "jobs     2" in text
    assert "p50 0.30 s" in text
    assert "double_start           1" in text
    assert f"x.run-events[0]@{len(events) - 1}" in text
    assert "|" in text
    assert "#" in text


def test_a_clean_report_says_so() -> None:
    out = io.StringIO()
    format_report(check(simple_history(3)), out)
    assert "violations 0 (clean)" in out.getvalue()


def test_lateness_percentiles() -> None:
    events: list[Event] = [job_event("upserted", T0, spec(schedule=None))]
    for k in range(100):
        t = T0 + (k + 1) * MIN
        events += [
            run_event(t, 1, "due", t, trigger="manual"),
            run_event(t, 2, "dispatched", t, trigger="manual"),
            run_event(t, 3, "running", t + (k + 1) * 10, trigger="manual"),
        ]
    lat = check(events, now_ms=T0 + 101 * MIN).lateness
    assert (lat.count, lat.p50_ms, lat.p99_ms, lat.max_ms) == (100, 500, 990, 1000)
    assert dict(lat.histogram)["0-0.1 s"] == 9


# -- worker reports: executions the ledger never sanctioned ----------------------------------
def check_all(
    events: list[Event],
    reports: Sequence[LedgerInput],
    config: AuditConfig = DEFAULT,
    now_ms: int | None = None,
) -> AuditReport:
    """Run-events at offsets of partition 0, the reports at offsets of job-log's."""
    located_reports = [(inp, 0, offset) for offset, inp in enumerate(reports)]
    return audit(located(events), config, now_ms, located_reports)


def one_run(job_spec: JobSpec | None = None) -> tuple[Ledger, str]:
    """A job firing hourly and its first run (for T0 + 1 h), due."""
    led = Ledger()
    led.register(replace(job_spec or spec(), schedule=EverySchedule(HOUR)), T0)
    led.fire("j", T0 + HOUR, at=T0 + HOUR)
    assert led.w.runs[rid(T0 + HOUR)].state == "due"
    return led, rid(T0 + HOUR)


def claimed(led: Ledger, run_id: str, worker: str, at: int, attempt: int = 1) -> None:
    job = run_id.partition("@")[0]
    assert not led.report(ClaimRequested(job, run_id, attempt, worker, at))


def test_the_worker_reports_of_a_clean_history_are_all_sanctioned() -> None:
    led = clean_ledger()
    report = check_all(led.events(), led.reports)
    assert report.clean, report.violations[:3]
    executions = [r for r in led.reports if isinstance(r, RunStarted | RunFinished)]
    assert report.reports == len(executions) > 100
    assert report.unjudged_reports == 0


def forged_cancel(led: Ledger, run_id: str, at: int) -> None:
    """What a ledger that cancelled a claimed attempt on its own word would have written
    (this ledger waits for the holder's answer, so the audit's rule is tested on a forged
    history: it is there for old logs and for a ledger that goes wrong)."""
    last = [e for e in led.w.events if isinstance(e, RunEvent) and e.run_id == run_id][-1]
    seq = int(last.event_id.rsplit("#", 1)[1]) + 1
    led.w.events.append(
        replace(last, event_id=f"{run_id}#{seq}", state="cancelled", at_ms=at, reason="forged")
    )


def test_a_start_after_the_ledger_cancelled_the_attempt_is_unsanctioned() -> None:
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    forged_cancel(led, run_id, t - 1_000)
    # The reports, not applied to the real ledger (which never cancelled the claim).
    led.reports.append(RunStarted("j", run_id, 1, "w1", t + 300))
    led.reports.append(RunFinished("j", run_id, 1, "w1", 0, "", t + 2_000))
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert kinds(report) == {"unsanctioned_execution": 1}  # one execution, two reports
    (v,) = report.violations
    assert (v.source, v.partition, v.offset, v.run_id) == ("job-log", 0, 1, run_id)
    assert "w1 started attempt 1: it held the attempt" in v.detail
    assert "the claim was cancelled at" in v.detail


def test_a_cancel_of_a_claimed_attempt_waits_for_its_holder_and_audits_clean() -> None:
    """The ledger's side of the rule above: a cancel of a claimed attempt is settled by
    its holder's answer, so a start that raced the stop order is on the record."""
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    order = led.w.apply(CancelRequested("j", run_id, t - 1_000)).replies
    assert [(type(o).__name__, o.worker_id) for o in order] == [("CancelOrder", "w1")]
    assert (led.w.runs[run_id].state, led.w.runs[run_id].cancelling) == (
        "dispatched",
        "cancelled by request",
    )
    assert not led.report(RunStarted("j", run_id, 1, "w1", t + 300))  # before the order came
    assert [e.state for e in led.w.events if isinstance(e, RunEvent)][-2:] == [
        "running",
        "cancelled",
    ]
    assert led.w.runs[run_id].reason == "cancelled by request (it had started)"
    assert led.report(RunFinished("j", run_id, 1, "w1", None, "cancelled", t + 400))
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert report.clean, report.violations


@pytest.mark.parametrize("end", ["cancel", "lost"])
def test_an_execution_under_way_when_the_ledger_ended_the_claim_is_covered(end: str) -> None:
    """The worker started before the cancel or the verdict, its report came after: the
    ledger's record (cancelled; lost, whether it did its work unknown) covers it."""
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    if end == "cancel":
        forged_cancel(led, run_id, t + 5_000)
        led.reports.append(RunStarted("j", run_id, 1, "w1", t + 300))
    else:
        led.w.apply(WorkerLost("j", run_id, 1, "w1", t + 5_000))
        assert led.report(RunStarted("j", run_id, 1, "w1", t + 300))
    code = 0 if end == "cancel" else None  # stopped by the cancel; fenced before the verdict
    error = "" if end == "cancel" else "fenced: the worker could not prove it was alive"
    finished = RunFinished("j", run_id, 1, "w1", code, error, t + 4_000 + 2 * SEC)
    if end == "cancel":
        led.reports.append(finished)
    else:
        assert led.report(finished)
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert report.clean, report.violations
    # An exit after the verdict: it was still running when the ledger declared it lost.
    if end == "lost":
        late = RunFinished("j", run_id, 1, "w1", 0, "", t + 9_000)
        report = check_all(led.events(), [*led.reports, late], now_ms=t + MIN)
        assert kinds(report) == {"unsanctioned_execution": 1}
        assert "exited 0" in report.violations[0].detail


def test_a_finish_carrying_a_start_after_the_ledger_cancelled_the_attempt_is_unsanctioned() -> None:
    """A short run's one report (its start in `started_ms`) is judged by that start, as
    the start on its own would be, not passed as the end of a run stopped by its cancel."""
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    forged_cancel(led, run_id, t - 1_000)
    led.reports.append(RunFinished("j", run_id, 1, "w1", 0, "", t + 2_000, started_ms=t + 300))
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert kinds(report) == {"unsanctioned_execution": 1}
    (v,) = report.violations
    assert "w1 started and exited 0 attempt 1: it held the attempt" in v.detail
    assert "the claim was cancelled at" in v.detail
    # Started before the cancel: the cancel covers it, however late it ended.
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    forged_cancel(led, run_id, t + 5_000)
    led.reports.append(RunFinished("j", run_id, 1, "w1", 0, "", t + 9_000, started_ms=t + 300))
    assert check_all(led.events(), led.reports, now_ms=t + MIN).clean


@pytest.mark.parametrize("combined", [False, True])
def test_a_start_after_its_holder_released_a_cancelled_attempt_is_unsanctioned(
    combined: bool,
) -> None:
    """The real ledger: a cancel waits for the holder, which releases the attempt
    (never started, it says); a start after that is found, in two reports or one."""
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    led.w.apply(CancelRequested("j", run_id, t - 2_000))
    assert not led.report(RunReleased("j", run_id, 1, "w1", "cancelled", t - 1_000))
    assert led.w.runs[run_id].state == "cancelled"
    if combined:
        led.report(RunFinished("j", run_id, 1, "w1", 0, "", t + 900, started_ms=t + 300))
    else:
        led.report(RunStarted("j", run_id, 1, "w1", t + 300))
        led.report(RunFinished("j", run_id, 1, "w1", 0, "", t + 900))
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert kinds(report) == {"unsanctioned_execution": 1}
    assert "w1 started" in report.violations[0].detail


@pytest.mark.parametrize(
    ("start", "end", "code", "found"),
    [
        (300, 4_000, None, False),  # fenced: started and ended before the verdict
        (300, 5_500, 0, False),  # ended within the clock tolerance after it
        (300, 9_000, 0, True),  # still running when the ledger declared it lost
        (300, 9_000, None, True),  # still running then, killed (fenced) after it
        (7_000, 7_500, 0, True),  # started after the verdict
        (7_000, 7_500, None, True),  # started after the verdict, then killed
    ],
)
def test_a_finish_carrying_its_start_is_judged_by_both_against_a_lost_verdict(
    start: int, end: int, code: int | None, found: bool
) -> None:
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    led.w.apply(WorkerLost("j", run_id, 1, "w1", t + 5_000))
    error = "" if code is not None else "fenced: the worker could not prove it was alive"
    report_ = RunFinished("j", run_id, 1, "w1", code, error, t + end, started_ms=t + start)
    led.report(report_)
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    if found:
        assert kinds(report) == {"unsanctioned_execution": 1}
        assert "the claim was ended without a start" in report.violations[0].detail
    else:
        assert report.clean, report.violations


def test_a_start_after_the_worker_was_declared_dead_is_unsanctioned() -> None:
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    led.w.apply(WorkerLost("j", run_id, 1, "w1", t + 20_000))
    assert led.w.runs[run_id].state == "retrying"
    assert led.report(RunStarted("j", run_id, 1, "w1", t + 25_000))
    retry = led.w.runs[run_id].deadline_ms
    assert retry is not None
    led.w.apply(DeadlineReached("j", run_id, 1, "retry", retry))
    claimed(led, run_id, "w2", retry + 100, attempt=2)
    assert not led.report(RunStarted("j", run_id, 2, "w2", retry + 200))
    assert not led.report(RunFinished("j", run_id, 2, "w2", 0, "", retry + 300))
    report = check_all(led.events(), led.reports, now_ms=t + 5 * MIN)
    assert kinds(report) == {"unsanctioned_execution": 1}
    detail = report.violations[0].detail
    assert "the claim was ended without a start (lost or timed out) at " in detail


def test_executions_by_a_worker_that_never_held_the_attempt() -> None:
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    assert not led.report(RunStarted("j", run_id, 1, "w1", t + 300))
    assert led.report(RunStarted("j", run_id, 1, "w2", t + 400))  # never granted to w2
    assert led.report(RunFinished("j", run_id, 1, "w2", 0, "", t + 1_000))
    assert led.report(RunFinished("j", run_id, 1, "w3", 1, "", t + 1_100))  # an exit code
    assert not led.report(RunFinished("j", run_id, 1, "w1", 0, "", t + 2_000))
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert kinds(report) == {"unsanctioned_execution": 2}
    first, second = report.violations
    assert first.offset == 2
    assert "w2 started attempt 1: it never held the attempt (held by w1)" in first.detail
    assert second.offset == 4
    assert "w3 exited 1" in second.detail


def test_a_start_by_a_worker_that_gave_its_claim_back_is_unsanctioned() -> None:
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    assert not led.report(RunReleased("j", run_id, 1, "w1", "no room", t - 8_000))
    claimed(led, run_id, "w2", t - 7_000)
    assert not led.report(RunStarted("j", run_id, 1, "w2", t + 300))
    assert led.report(RunStarted("j", run_id, 1, "w1", t + 350))  # started all the same
    assert not led.report(RunFinished("j", run_id, 1, "w2", 0, "", t + 2_000))
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert kinds(report) == {"unsanctioned_execution": 1}
    assert "w1 started attempt 1: it held the attempt" in report.violations[0].detail


def test_reports_that_are_not_unsanctioned_executions() -> None:
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    assert led.report(ClaimRequested("j", run_id, 1, "w2", t - 8_000))  # refused claim
    assert led.report(RunReleased("j", run_id, 1, "w2", "claim refused", t - 7_000))
    assert led.report(RunFinished("j", run_id, 1, "w2", None, "cancelled", t - 6_000))
    assert not led.report(RunStarted("j", run_id, 1, "w1", t + 300))
    assert not led.report(RunFinished("j", run_id, 1, "w1", 0, "", t + 2_000))
    # Duplicates of the sanctioned execution, after the ledger moved on.
    assert led.report(RunStarted("j", run_id, 1, "w1", t + 300))
    assert led.report(RunFinished("j", run_id, 1, "w1", 0, "", t + 2_000))
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert report.clean, report.violations
    assert report.reports == 5  # the starts and finishes


def test_an_outcome_accepted_before_its_late_start_report_is_sanctioned() -> None:
    t = T0 + HOUR
    led, run_id = one_run()
    claimed(led, run_id, "w1", t - 9_000)
    assert not led.report(RunFinished("j", run_id, 1, "w1", 0, "", t + 2_000))
    assert led.w.runs[run_id].state == "succeeded"
    assert led.report(RunStarted("j", run_id, 1, "w1", t + 300))  # resent, late
    report = check_all(led.events(), led.reports, now_ms=t + MIN)
    assert report.clean, report.violations


def test_a_start_after_a_timeout_without_any_report_is_unsanctioned() -> None:
    t = T0 + HOUR
    led, run_id = one_run(spec(idempotent=False))
    claimed(led, run_id, "w1", t - 9_000)
    run = led.w.runs[run_id]
    assert run.deadline_kind == "timeout"
    assert run.deadline_ms is not None
    led.w.apply(DeadlineReached("j", run_id, 1, "timeout", run.deadline_ms))  # asks
    asked = led.w.runs[run_id].deadline_ms
    assert asked is not None
    led.w.apply(DeadlineReached("j", run_id, 1, "timeout", asked))  # no answer: fails
    assert led.w.runs[run_id].state == "failed"
    assert led.report(RunFinished("j", run_id, 1, "w1", 0, "", asked + 5_000))
    report = check_all(led.events(), led.reports, now_ms=asked + MIN)
    assert kinds(report) == {"unsanctioned_execution": 1}
    assert "w1 exited 0 attempt 1: it held the attempt" in report.violations[0].detail


def test_reports_the_replay_cannot_judge() -> None:
    t = T0 + MIN
    events = simple_history(2)
    auditor = Auditor(AuditConfig(partial=True))
    later = T0 + 3 * MIN
    # A run first seen mid-life (a --from window): its first attempt began before.
    mid_life: list[Event] = [run_event(later, 3, "running", later, worker="w9")]
    for offset, event in enumerate(events + mid_life):
        auditor.record(event, 0, offset)
    judged = [
        RunStarted("j", rid(t), 1, "w", t + 500),  # the sanctioned start
        RunStarted("j", rid(later), 1, "w1", later),  # before the window
        RunStarted("other", rid(t, "other"), 1, "w", t),  # a job not in the replay
        RunStarted("j", "j@not-a-run", 1, "w", t),  # partial: may be before the window
    ]
    for offset, inp in enumerate(judged):
        auditor.report(inp, 0, offset)
    auditor.report(RunStarted("j", rid(t), 1, "w2", t), 0, 9, decided=False)
    report = auditor.finish()
    assert report.clean, report.violations
    assert (report.reports, report.unjudged_reports) == (1, 4)


def test_a_run_that_does_not_exist_is_unsanctioned_in_a_full_replay() -> None:
    events = simple_history(2)
    report = check_all(events, [RunStarted("j", "j@forged", 1, "w", T0)])
    assert kinds(report) == {"unsanctioned_execution": 1}
    assert "run-events has no run j@forged" in report.violations[0].detail


def test_the_start_of_the_holder_of_a_claim_still_open_is_in_flight() -> None:
    t = T0 + MIN
    events: list[Event] = [job_event("upserted", T0, spec())]
    events += life(t)[:2]  # due, dispatched to w
    report = check_all(events, [RunStarted("j", rid(t), 1, "w", t + 500)], now_ms=t)
    assert report.clean
    assert report.unjudged_reports == 1
    # Another worker's start of it is judged, and unsanctioned.
    report = check_all(events, [RunStarted("j", rid(t), 1, "w2", t + 500)], now_ms=t)
    assert kinds(report) == {"unsanctioned_execution": 1}


def test_record_after_report_is_refused() -> None:
    auditor = Auditor()
    for event, p, o in located(simple_history(1)):
        auditor.record(event, p, o)
    auditor.report(RunStarted("j", rid(T0 + MIN), 1, "w", T0 + MIN), 0, 0)
    with pytest.raises(RuntimeError, match="run-events come first"):
        auditor.record(life(T0 + 2 * MIN)[0], 0, 99)


def test_grants_of_many_workers_and_attempts_are_kept_apart() -> None:
    """Attempts claimed by several workers, one claim released: each (attempt, worker)
    is judged by itself."""
    t = T0 + MIN
    events: list[Event] = [job_event("upserted", T0, spec(retry=RetryPolicy(max_attempts=3)))]
    states: list[tuple[RunStateName, int, str]] = [
        ("due", 1, ""),
        ("dispatched", 1, "a"),
        ("due", 1, ""),  # released by a
        ("dispatched", 1, "b"),
        ("running", 1, "b"),
        ("retrying", 1, "b"),
        ("due", 2, ""),
        ("dispatched", 2, "a"),
        ("running", 2, "a"),
        ("succeeded", 2, "a"),
    ]
    for seq, (state, attempt, worker) in enumerate(states, start=1):
        events.append(run_event(t, seq, state, t + seq, attempt=attempt, worker=worker))
    sanctioned = [RunStarted("j", rid(t), 1, "b", t), RunStarted("j", rid(t), 2, "a", t)]
    assert check_all(events, sanctioned, now_ms=t + MIN).clean
    for attempt, worker, held in ((1, "a", True), (2, "b", False), (3, "a", False)):
        report = check_all(events, [RunStarted("j", rid(t), attempt, worker, t)], now_ms=t)
        assert kinds(report) == {"unsanctioned_execution": 1}, (attempt, worker)
        assert ("it held the attempt" in report.violations[0].detail) == held


# -- overlapping attempts ---------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["forbid", "replace"])
def test_a_firing_created_beside_a_live_run_overlaps_under_forbid_and_replace(
    policy: str,
) -> None:
    t1, t2 = T0 + MIN, T0 + 2 * MIN
    events: list[Event] = [job_event("upserted", T0, spec(concurrency=policy))]
    events += life(t1)[:3]  # running
    events.append(run_event(t2, 1, "due", t2 - 10_000))  # beside it
    events += life(t1)[3:]
    report = check(events, now_ms=t2)
    assert kinds(report) == {"overlapping_attempts": 1}
    (v,) = report.violations
    assert (v.run_id, v.offset) == (rid(t2), 4)
    assert f"1 other run(s) of the job were live (concurrency {policy})" in v.detail
    # Allowed, and never for a manual run.
    allowed = [job_event("upserted", T0, spec()), *events[1:]]
    assert check(allowed, now_ms=t2).clean
    manual = [*events[:4], run_event(t2, 1, "due", t2, trigger="manual"), *events[5:]]
    assert check(manual, now_ms=t2).clean


@pytest.mark.parametrize("policy", ["forbid", "replace"])
def test_the_ledger_keeps_its_concurrency_policies(policy: str) -> None:
    """A run that outlasts the next firing: skipped (forbid) or replaced (replace)."""
    led = Ledger()
    led.register(spec(concurrency=policy, idempotent=False), T0)
    t1, t2 = T0 + MIN, T0 + 2 * MIN
    led.fire("j", t1, at=t1)  # no earlier: the policy is applied at the firing's time
    claimed(led, rid(t1), "w1", t1 + 100)
    assert not led.report(RunStarted("j", rid(t1), 1, "w1", t1 + 300))
    led.fire("j", t2, at=t2)
    assert led.w.runs[rid(t2)].state == ("skipped" if policy == "forbid" else "due")
    led.report(RunFinished("j", rid(t1), 1, "w1", None, "cancelled", t2 - 5_000))
    report = check_all(led.events(), led.reports, now_ms=t2 + MIN)
    assert report.clean, report.violations


def lost_then_retried(job_spec: JobSpec) -> tuple[Ledger, str, int]:
    """w1 runs attempt 1, is declared dead; attempt 2 (idempotent) or the next firing
    (not idempotent) starts on w2. Returns the ledger, the run of w1 and w2's start."""
    t = T0 + HOUR
    led, run_id = one_run(job_spec)
    claimed(led, run_id, "w1", t + 100)
    assert not led.report(RunStarted("j", run_id, 1, "w1", t + 300))
    led.w.apply(WorkerLost("j", run_id, 1, "w1", t + 10_000))
    run = led.w.runs[run_id]
    if run.state == "retrying":
        assert run.deadline_ms is not None
        start = run.deadline_ms + 1_000
        led.w.apply(DeadlineReached("j", run_id, 1, "retry", run.deadline_ms))
        claimed(led, run_id, "w2", start - 500, attempt=2)
        assert not led.report(RunStarted("j", run_id, 2, "w2", start))
    else:
        assert run.state == "failed"
        t2 = t + HOUR
        led.fire("j", t2, at=t2)
        start = t2 + 300
        claimed(led, rid(t2), "w2", t2 + 100)
        assert not led.report(RunStarted("j", rid(t2), 1, "w2", start))
    return led, run_id, start


@pytest.mark.parametrize("idempotent", [True, False], ids=["retried", "next-firing"])
def test_an_execution_still_going_when_the_ledger_started_the_next_overlaps(
    idempotent: bool,
) -> None:
    led, run_id, start = lost_then_retried(spec(idempotent=idempotent, concurrency="forbid"))
    events, reports = led.events(), list(led.reports)
    # w1's job was never fenced: it reports its end, 5 s after w2's start.
    late = RunFinished("j", run_id, 1, "w1", 0, "", start + 5_000)
    report = check_all(events, [*reports, late], now_ms=start + 5 * MIN)
    assert kinds(report) == {"overlapping_attempts": 1}
    (v,) = report.violations
    assert (v.source, v.offset, v.run_id) == ("job-log", len(reports), run_id)
    expected = "attempt 2 started" if idempotent else f"run of the job for {iso_utc(T0 + 2 * HOUR)}"
    assert expected in v.detail
    # Ended before the start (within the clock tolerance), or its end unknown: no overlap.
    for fine in (
        replace(late, at_ms=start + 900),
        replace(late, exit_code=None, error="lost: the worker restarted"),
    ):
        assert check_all(events, [*reports, fine], now_ms=start + 5 * MIN).clean


def test_a_rerun_of_an_older_firing_of_a_forbid_job_is_no_overlap() -> None:
    """A rerun (or a backfill) is for a time before runs that started long before it."""
    led = Ledger()
    led.register(spec(concurrency="forbid", schedule=EverySchedule(HOUR)), T0)
    t1, t2 = T0 + HOUR, T0 + 2 * HOUR
    for t in (t1, t2):
        led.fire("j", t, at=t)
        led.execute("j", t)
    led.w.apply(RerunRequested("j", rid(t1), "again", t2 + 10 * MIN))
    claimed(led, rid(t1), "w1", t2 + 10 * MIN + 100, attempt=2)
    assert not led.report(RunStarted("j", rid(t1), 2, "w1", t2 + 10 * MIN + 200))
    assert not led.report(RunFinished("j", rid(t1), 2, "w1", 0, "", t2 + 11 * MIN))
    report = check_all(led.events(), led.reports, now_ms=t2 + 20 * MIN)
    assert report.clean, report.violations


def test_a_later_run_of_a_job_that_allows_concurrency_is_no_overlap() -> None:
    led, run_id, start = lost_then_retried(spec(idempotent=False))
    late = RunFinished("j", run_id, 1, "w1", 0, "", start + 5_000)
    report = check_all(led.events(), [*led.reports, late], now_ms=start + 5 * MIN)
    assert report.clean, report.violations


# -- DAG steps: periods -----------------------------------------------------------------------
def dag(
    upstream_every: int = 10 * MIN, periods: int = 8, failing: tuple[int, ...] = (3,)
) -> Ledger:
    """a (every `upstream_every`) -> b (a step) -> c (a step); a's run k fails for k in
    `failing`, every other run of the chain succeeds."""
    led = Ledger()
    once = RetryPolicy(max_attempts=1)
    led.register(spec("a", schedule=EverySchedule(upstream_every), retry=once), T0)
    led.register(spec("b", schedule=None, depends_on=("a",)), T0 + 1)
    led.register(spec("c", schedule=None, depends_on=("b",)), T0 + 2)
    for k in range(1, periods + 1):
        t = T0 + k * upstream_every
        led.fire("a", t)
        led.execute("a", t, exit_code=1 if k in failing else 0)
        for step in ("b", "c"):
            if led.w.runs.get(rid(t, step)) is not None and led.w.runs[rid(t, step)].state == "due":
                led.execute(step, t)
    return led


def without(events: list[Event], run_id: str) -> list[Event]:
    return [e for e in events if not (isinstance(e, RunEvent) and e.run_id == run_id)]


def test_a_dag_chain_from_the_ledger_audits_clean() -> None:
    led = dag(failing=(3, 4))
    events = led.events()
    assert led.w.runs[rid(T0 + 30 * MIN, "b")].state == "skipped"
    assert led.w.runs[rid(T0 + 30 * MIN, "c")].state == "skipped"
    assert led.w.runs[rid(T0 + 50 * MIN, "c")].state == "succeeded"
    report = check_all(events, led.reports, now_ms=T0 + 90 * MIN)
    assert report.clean, report.violations
    assert (report.dag_steps, report.dag_periods) == (2, 16)


@pytest.mark.parametrize(
    ("k", "what"), [(3, "did not succeed"), (5, "succeeded")], ids=["skip", "run"]
)
def test_a_dropped_period_of_a_step_is_a_missing_period(k: int, what: str) -> None:
    t = T0 + k * 10 * MIN
    events = without(dag().events(), rid(t, "b"))
    report = check(events, now_ms=T0 + 90 * MIN)
    assert kinds(report) == {"missing_period": 1}
    (v,) = report.violations
    assert (v.job_id, v.run_id) == ("b", rid(t, "a"))
    assert f"upstream a's run for {iso_utc(t)} {what}" in v.detail
    # The last period dropped: nothing covers it either.
    last = T0 + 80 * MIN
    report = check(without(dag().events(), rid(last, "b")), now_ms=T0 + 90 * MIN)
    assert kinds(report) == {"missing_period": 1}


def test_periods_in_flight_or_while_paused_are_not_missing() -> None:
    led = dag(periods=8)
    events = without(led.events(), rid(T0 + 80 * MIN, "b"))
    # The last outcome is within the notice lag of "now" less the safety margin.
    assert check(events, now_ms=T0 + 80 * MIN + 3 * MIN).clean
    # A step paused before the upstream's run ended (and resumed after) drops its notice.
    led = Ledger()
    led.register(spec("a", schedule=EverySchedule(10 * MIN)), T0)
    led.register(spec("b", schedule=None, depends_on=("a",)), T0 + 1)
    for k in range(1, 6):
        t = T0 + k * 10 * MIN
        if k == 3:
            led.w.apply(JobPaused("b", t - MIN))
        led.fire("a", t)
        led.execute("a", t)
        if k == 3:
            led.w.apply(JobResumed("b", t + MIN))
        if led.w.runs.get(rid(t, "b")) is not None:
            led.execute("b", t)
    assert rid(T0 + 30 * MIN, "b") not in led.w.runs
    report = check_all(led.events(), led.reports, now_ms=T0 + 58 * MIN)
    assert report.clean, report.violations


def test_upstream_outcomes_covered_by_a_later_record_are_not_missing() -> None:
    """Two upstream runs ending out of order: the later one's record covers both."""
    led = Ledger()
    led.register(spec("a", schedule=EverySchedule(10 * MIN)), T0)
    led.register(spec("b", schedule=None, depends_on=("a",)), T0 + 1)
    t1, t2 = T0 + 10 * MIN, T0 + 20 * MIN
    led.fire("a", t1)
    claimed(led, rid(t1, "a"), "w1", t1)
    led.report(RunStarted("a", rid(t1, "a"), 1, "w1", t1 + 300))
    led.fire("a", t2)
    led.execute("a", t2)
    # A long run: it ends after its successor.
    led.report(RunFinished("a", rid(t1, "a"), 1, "w1", 0, "", t2 + 5_000))
    assert rid(t1, "b") not in led.w.runs
    report = check_all(led.events(), led.reports, now_ms=T0 + 28 * MIN)
    assert report.clean, report.violations


def test_a_step_with_two_upstreams_misses_a_period_all_succeeded() -> None:
    led = Ledger()
    for upstream in ("a1", "a2"):
        led.register(spec(upstream, schedule=EverySchedule(10 * MIN)), T0)
    led.register(spec("s", schedule=None, depends_on=("a1", "a2")), T0 + 1)
    for k in range(1, 5):
        t = T0 + k * 10 * MIN
        for upstream in ("a1", "a2"):
            led.fire(upstream, t)
        led.execute("a1", t)
        led.w.apply(FireProposed("a2", t, t, "n"))
        run = led.w.runs[rid(t, "a2")]
        # a2 ends 3 minutes after a1: a1's success was surely decided before.
        led.report(ClaimRequested("a2", run.run_id, 1, "w1", t))
        led.report(RunStarted("a2", run.run_id, 1, "w1", t + 1_000))
        led.report(RunFinished("a2", run.run_id, 1, "w1", 0, "", t + 3 * MIN))
        assert led.w.runs[rid(t, "s")].state == "due"
        led.execute("s", t)
    events = led.events()
    now = T0 + 49 * MIN + 30_000
    assert check(events, now_ms=now).clean
    report = check(without(events, rid(T0 + 40 * MIN, "s")), now_ms=now)
    assert kinds(report) == {"missing_period": 1}
    assert "every upstream of s succeeded" in report.violations[0].detail
    # A middle period with several upstreams is covered by the next record: not checked.
    assert check(without(events, rid(T0 + 20 * MIN, "s")), now_ms=now).clean


def test_a_step_waiting_for_its_other_upstream_misses_nothing() -> None:
    led = Ledger()
    led.register(spec("a1", schedule=EverySchedule(10 * MIN)), T0)
    led.register(spec("a2", schedule=EverySchedule(24 * HOUR)), T0)
    led.register(spec("s", schedule=None, depends_on=("a1", "a2")), T0 + 1)
    for k in range(1, 5):
        led.fire("a1", T0 + k * 10 * MIN)
        led.execute("a1", T0 + k * 10 * MIN)  # a2 does not run meanwhile
    report = check_all(led.events(), led.reports, now_ms=T0 + 48 * MIN)
    assert report.clean, report.violations
    assert report.dag_steps == 1


# -- the real ledger under the deterministic simulation's faults -------------------------------
@pytest.mark.parametrize("seed", range(5))
def test_the_simulated_ledger_and_workers_leave_no_unsanctioned_execution(seed: int) -> None:
    """Duplicated, delayed and reordered reports, claims racing, workers dead or slow,
    pauses, changes, reruns and backfills (tests/unit/test_simulation.py): what the
    ledger decided and the reports it was sent audit without an unsanctioned execution,
    a missing period or a firing created beside a live run. The simulation's clocks are
    seconds apart and its notices may wait long: the tolerances say so. (Its slow workers
    are never fenced, so an overlap of executions by their own word may be real there.)"""
    from tests.unit.test_simulation import CONFIG, simulate

    sim = simulate(seed, 1000)
    config = AuditConfig(
        catchup_window_ms=CONFIG.catchup_window_ms,
        timeout_grace_ms=CONFIG.timeout_grace_ms,
        claim_timeout_ms=CONFIG.claim_timeout_ms,
        dependency_wait_ms=CONFIG.dependency_wait_ms,
        clock_tolerance_ms=16 * SEC,  # worker clocks up to 8 s either way
        notice_lag_ms=MIN,
    )
    auditor = Auditor(config)
    for offset, event in enumerate(sim.world.events):
        auditor.record(event, 0, offset)
    for offset, (inp, _) in enumerate(sim.log):
        auditor.report(inp, 0, offset)
    report = auditor.finish()
    assert report.reports > 0
    found = [
        v
        for v in report.violations
        if v.kind in ("unsanctioned_execution", "missing_period")
        or (v.kind == "overlapping_attempts" and v.source == "run-events")
    ]
    assert not found, found[:3]


def test_a_rerun_during_a_later_run_of_a_forbid_job_is_the_operators_and_no_overlap() -> None:
    """`forbid` governs the schedule's firings: a rerun of t1 asked while t2 runs starts
    at once, beside it (the ledger lets it, the audit agrees); the next firing while
    the rerun is live is skipped."""
    led = Ledger()
    led.register(spec(concurrency="forbid", idempotent=False), T0)
    t1, t2, t3 = T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN
    led.fire("j", t1, at=t1)
    led.execute("j", t1)
    led.fire("j", t2, at=t2)
    claimed(led, rid(t2), "w1", t2 + 100)
    assert not led.report(RunStarted("j", rid(t2), 1, "w1", t2 + 300))
    led.w.apply(RerunRequested("j", rid(t1), "again", t2 + 1_000))
    claimed(led, rid(t1), "w2", t2 + 1_100, attempt=2)
    assert not led.report(RunStarted("j", rid(t1), 2, "w2", t2 + 1_200))
    assert not led.report(RunFinished("j", rid(t2), 1, "w1", 0, "", t2 + 30_000))
    led.fire("j", t3, at=t3)
    assert led.w.runs[rid(t3)].state == "skipped"  # the rerun is live
    assert not led.report(RunFinished("j", rid(t1), 2, "w2", 0, "", t3 + 10_000))
    report = check_all(led.events(), led.reports, now_ms=t3 + 30_000)
    assert report.clean, report.violations


def test_a_switch_to_forbid_withdraws_the_firings_decided_ahead() -> None:
    """Runs created ahead under `allow` were never judged by `forbid`: the switch
    withdraws them, and each is decided again at its time: still withdrawn while a run
    of the job is live (j), revived when none is (k). Nothing overlaps, the audit is
    clean."""
    led = Ledger()
    led.register(spec(idempotent=False), T0)
    led.register(spec("k", idempotent=False), T0)
    t1, t2, t3 = T0 + MIN, T0 + 2 * MIN, T0 + 3 * MIN
    led.fire("j", t1, at=t1)
    claimed(led, rid(t1), "w1", t1 + 100)
    assert not led.report(RunStarted("j", rid(t1), 1, "w1", t1 + 300))
    led.cycle("k", t1)
    for job in ("j", "k"):
        led.fire(job, t2, at=t2 - 20_000)  # ahead, under allow
        assert led.w.runs[rid(t2, job)].state == "due"
        led.register(spec(job, concurrency="forbid", idempotent=False), t2 - 5_000)
        assert led.w.runs[rid(t2, job)].state == "cancelled"
        led.fire(job, t2, at=t2)
    assert led.w.runs[rid(t2)].state == "cancelled"  # t1 still runs: t2 never ran
    assert led.w.runs[rid(t2, "k")].state == "due"  # nothing live: revived
    led.execute("k", t2, attempt=2)
    assert not led.report(RunFinished("j", rid(t1), 1, "w1", 0, "", t2 + 30_000))
    led.fire("j", t3, at=t3)
    led.execute("j", t3)
    report = check_all(led.events(), led.reports, now_ms=t3 + 30_000)
    assert report.clean, report.violations
