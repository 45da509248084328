"""The audit says the ledger's rules on a schedule's limits (issue 52): `max_runs` (no
firing is expected once the schedule made its runs) and the concurrency policy in force
when a firing was decided (`forbid` forbids a run decided under it from starting beside
another; runs decided earlier under `allow` keep their decision).

Histories are built by hand (the rules exactly as the audit reads them) and, for the
cases the docs describe, driven through the real ledger (tests/support/world.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

from schemas.records import (
    ClaimRequested,
    FireProposed,
    LedgerInput,
    RunFinished,
    RunNowRequested,
    RunStarted,
    WorkerLost,
)
from streams.core.ids import iso_utc, manual_run_id
from streams.core.ledger.decision import (
    WITHDRAWN_BY_CHANGE,
    WITHDRAWN_BY_DELETE,
    WITHDRAWN_BY_PAUSE,
)
from tests.unit.test_audit import (
    MIN,
    SEC,
    T0,
    Event,
    Ledger,
    check,
    check_all,
    claimed,
    job_event,
    kinds,
    life,
    rid,
    run_event,
    spec,
)


def at(minute: float) -> int:
    return T0 + int(minute * MIN)


def missing_minutes(events: list[Event], now_ms: int | None = None) -> list[float]:
    """The minutes (after T0) the audit reports as missing firings."""
    report = check(events, now_ms=now_ms)
    assert set(kinds(report)) <= {"missing_firing"}, report.violations[:3]
    return sorted(
        (t - T0) / MIN for v in report.of_kind("missing_firing") for t in [_time_of(v.detail)]
    )


def _time_of(detail: str) -> int:
    """The fire time a missing_firing's detail names ("no run for the firing at <iso> ...")."""
    iso = detail.split("firing at ", 1)[1].split(" ", 1)[0]
    return int(datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() * 1000)


# -- max_runs -----------------------------------------------------------------------------
def test_the_ledger_stops_at_max_runs_and_the_audit_expects_nothing_after() -> None:
    """The documented case: `every: 1m`, `max_runs: 3`: three runs, then nothing."""
    led = Ledger()
    led.register(spec(max_runs=3), T0)
    for minute in (1, 2, 3):
        led.cycle("j", at(minute))
    led.fire("j", at(4))
    assert led.w.rejections[-1] == "the schedule made its 3 runs (max_runs)"
    assert led.w.jobs["j"].next_due_ms is None
    report = check(led.events(), now_ms=at(30))
    assert report.clean, report.violations[:3]
    assert report.expected_firings == 3  # minutes 1..3: later ones are not due


def test_a_firing_missing_below_max_runs_is_still_reported() -> None:
    """Minute 2 is missing while two runs of three were made: reported; minute 5 comes
    after the third run (minute 4): not expected."""
    events: list[Event] = [job_event("upserted", T0, spec(max_runs=3))]
    for minute in (1, 3, 4):
        events += life(at(minute))
    assert missing_minutes(events, now_ms=at(30)) == [2]
    # Without max_runs every later minute is missing; with a higher one, up to it.
    unlimited = [job_event("upserted", T0, spec()), *events[1:]]
    assert missing_minutes(unlimited, now_ms=at(10)) == [2, 5, 6, 7, 8]
    higher = [job_event("upserted", T0, spec(max_runs=5)), *events[1:]]
    assert missing_minutes(higher, now_ms=at(7)) == [2, 5]


def test_runs_that_do_not_count_do_not_stop_the_schedule() -> None:
    """Skipped firings, run-now, backfills and a rerun are not the schedule's runs."""
    events: list[Event] = [job_event("upserted", T0, spec(max_runs=2))]
    events += life(at(1))
    events.append(run_event(at(2), 0, "skipped", at(2) + 61 * SEC))  # misfire
    t = at(2) + 30 * SEC
    events += [
        run_event(t, 1, "due", t, trigger="manual"),
        run_event(t, 2, "dispatched", t, trigger="manual", worker="w"),
        run_event(t, 3, "running", t, trigger="manual", worker="w"),
        run_event(t, 4, "succeeded", t + SEC, trigger="manual", worker="w"),
    ]
    b = T0 - 5 * MIN  # a backfill, before registration
    events += [run_event(b, 1, "due", at(2) + 40 * SEC, trigger="backfill")]
    events += [run_event(b, 2, "cancelled", at(2) + 41 * SEC, trigger="backfill")]
    # A rerun of minute 1 (a new attempt of a run the schedule made once).
    events += [
        run_event(at(1), 5, "due", at(2) + 50 * SEC, attempt=2),
        run_event(at(1), 6, "cancelled", at(2) + 55 * SEC, attempt=2),
    ]
    # One run of two so far: minute 3 is due and missing; minute 4's run is the second.
    events += life(at(4))
    assert missing_minutes(events, now_ms=at(30)) == [3]


def _withdrawn_third(reason: str, minutes_after: tuple[int, ...]) -> list[Event]:
    """max_runs 3: minutes 1 and 2 run; minute 3's run, created ahead, is cancelled by a
    pause 5 s before its time with `reason`; the job resumes at minute 5.5 and runs the
    minutes given."""
    events: list[Event] = [job_event("upserted", T0, spec(max_runs=3))]
    events += life(at(1)) + life(at(2))
    t = at(3)
    events.append(run_event(t, 1, "due", t - 10 * SEC))
    events.append(job_event("paused", t - 5 * SEC))
    events.append(replace(run_event(t, 2, "cancelled", t - 5 * SEC), reason=reason))
    events.append(job_event("resumed", at(5.5)))
    for minute in minutes_after:
        events += life(at(minute))
    return events


def test_a_withdrawn_firing_gives_its_run_back() -> None:
    """Minute 3 was withdrawn: two runs made, so minute 6 is due (and the third run);
    minute 7 is not."""
    assert missing_minutes(_withdrawn_third(WITHDRAWN_BY_PAUSE, (6,)), now_ms=at(30)) == []
    assert missing_minutes(_withdrawn_third(WITHDRAWN_BY_PAUSE, ()), now_ms=at(8)) == [6]
    change = _withdrawn_third(WITHDRAWN_BY_CHANGE, ())
    assert missing_minutes(change, now_ms=at(8)) == [6]


def test_a_withdrawal_of_a_run_that_had_started_gives_nothing_back() -> None:
    """`(it had started)`: the run counts; nothing is due after the resume."""
    started = f"{WITHDRAWN_BY_PAUSE} (it had started)"
    assert missing_minutes(_withdrawn_third(started, ()), now_ms=at(30)) == []
    assert missing_minutes(_withdrawn_third("cancelled by alice", ()), now_ms=at(30)) == []


def test_a_revived_firing_counts_again() -> None:
    """Minute 3 withdrawn, then revived by a resume before its time: three runs made."""
    events: list[Event] = [job_event("upserted", T0, spec(max_runs=3))]
    events += life(at(1)) + life(at(2))
    t = at(3)
    events.append(run_event(t, 1, "due", t - 10 * SEC))
    events.append(job_event("paused", t - 8 * SEC))
    events.append(replace(run_event(t, 2, "cancelled", t - 8 * SEC), reason=WITHDRAWN_BY_PAUSE))
    events.append(job_event("resumed", t - 6 * SEC))
    events.append(
        replace(run_event(t, 3, "due", t - 5 * SEC, attempt=2), reason="revived: due again")
    )
    events.append(run_event(t, 4, "dispatched", t - 4 * SEC, attempt=2, worker="w"))
    events.append(run_event(t, 5, "running", t + SEC, attempt=2, worker="w"))
    events.append(run_event(t, 6, "succeeded", t + 2 * SEC, attempt=2, worker="w"))
    assert missing_minutes(events, now_ms=at(30)) == []
    # A rerun of the withdrawn run is the operator's: it does not count.
    rerun = [
        *events[:-4],
        replace(run_event(t, 3, "due", t - 5 * SEC, attempt=2), reason="rerun r1"),
        *events[-3:],
    ]
    assert missing_minutes(rerun, now_ms=at(6)) == [4]


def test_a_re_created_job_keeps_its_count() -> None:
    """The count belongs to the job id's whole history, as the ledger keeps it: two runs
    before the deletion, so the re-created job with max_runs 2 has nothing due; raised
    to 3, one more firing is."""
    events: list[Event] = [job_event("upserted", T0, spec(max_runs=2))]
    events += life(at(1)) + life(at(2))
    events.append(job_event("deleted", at(2.5)))
    events.append(job_event("upserted", at(5.5), spec(max_runs=2)))
    assert missing_minutes(events, now_ms=at(9)) == []
    events.append(job_event("upserted", at(9.5), spec(max_runs=3)))
    assert missing_minutes(events, now_ms=at(30))[0] == 10  # and every later one
    events += life(at(10))
    assert missing_minutes(events, now_ms=at(30)) == []


def test_a_withdrawal_confirmed_after_a_re_creation_is_given_back() -> None:
    """Minute 2, created ahead and claimed, is withdrawn by the deletion; its holder
    answers only after the re-creation: the count spans the id's history, so the run is
    given back then, and with max_runs 3 minute 4 is due (minutes 1 and 3 are the only
    runs before it); minute 5, after the third run, is not."""
    events: list[Event] = [job_event("upserted", T0, spec(max_runs=3))]
    t = at(2)
    events += life(at(1))
    events += [run_event(t, 1, "due", t - 10 * SEC), run_event(t, 2, "dispatched", t - 9 * SEC)]
    events.append(job_event("deleted", t - 5 * SEC))
    events.append(job_event("upserted", t - 2 * SEC, spec(max_runs=3)))
    events.append(replace(run_event(t, 3, "cancelled", t + SEC), reason=WITHDRAWN_BY_DELETE))
    events += life(at(3))
    assert missing_minutes(events, now_ms=at(6)) == [4]
    events += life(at(4))
    assert missing_minutes(events, now_ms=at(30)) == []


def test_the_max_runs_in_force_at_the_firing_decides() -> None:
    """Raised from 2 to 4 at minute 5.5: minutes 3..5 were not due (the old limit held);
    6 and 7 are (two more runs), 8 is not. Lowered to 1 at minute 6.5 instead: 7 is not."""
    base: list[Event] = [job_event("upserted", T0, spec(max_runs=2))]
    base += life(at(1)) + life(at(2))
    raised = [*base, job_event("upserted", at(5.5), spec(max_runs=4))]
    assert missing_minutes(raised, now_ms=at(8)) == [6]
    assert missing_minutes([*raised, *life(at(6)), *life(at(7))], now_ms=at(30)) == []
    assert missing_minutes([*raised, *life(at(6)), *life(at(8))], now_ms=at(30)) == [7]
    lowered = [*raised, *life(at(6)), job_event("upserted", at(6.5), spec(max_runs=1))]
    assert missing_minutes(lowered, now_ms=at(30)) == []


def test_a_lower_max_runs_keeps_the_runs_created_ahead() -> None:
    """The documented case: a lower max_runs withdraws nothing created ahead; the run
    made ahead runs, and nothing is due after it."""
    led = Ledger()
    led.register(spec(max_runs=5), T0)
    for minute in (1, 2, 3):
        led.cycle("j", at(minute))
    led.fire("j", at(4))  # created ahead, 10 s before its time
    led.register(spec(max_runs=2), at(4) - 5 * SEC)
    assert led.w.runs[rid(at(4))].state == "due"
    led.execute("j", at(4))
    led.fire("j", at(5))
    assert "max_runs" in led.w.rejections[-1]
    report = check_all(led.events(), led.reports, now_ms=at(30))
    assert report.clean, report.violations[:3]


def test_a_raised_max_runs_from_the_ledger_audits_clean() -> None:
    led = Ledger()
    led.register(spec(max_runs=2, misfire="skip"), T0)
    for minute in (1, 2):
        led.cycle("j", at(minute))
    led.fire("j", at(3))
    assert "max_runs" in led.w.rejections[-1]
    led.register(spec(max_runs=4, misfire="skip"), at(5) + 30 * SEC)
    # The change applies from its own time: 3, 4 and 5 were not due under max_runs 2.
    assert led.w.jobs["j"].next_due_ms == at(6)
    assert not [m for m in (3, 4, 5) if rid(at(m)) in led.w.runs]
    led.cycle("j", at(6))  # the third run
    led.cycle("j", at(7))  # the fourth
    led.fire("j", at(8))
    assert "max_runs" in led.w.rejections[-1]
    report = check_all(led.events(), led.reports, now_ms=at(30))
    assert report.clean, report.violations[:3]


def test_run_now_does_not_use_up_max_runs_on_the_ledger() -> None:
    led = Ledger()
    led.register(spec(max_runs=2), T0)
    led.cycle("j", at(1))
    led.w.apply(RunNowRequested("j", "now-1", at(1.5)))
    manual = manual_run_id("j", "now-1")
    claimed(led, manual, "w1", at(1.5) + 100)
    assert not led.report(RunStarted("j", manual, 1, "w1", at(1.5) + 200))
    assert not led.report(RunFinished("j", manual, 1, "w1", 0, "", at(1.5) + 900))
    led.cycle("j", at(2))
    led.fire("j", at(3))
    assert "max_runs" in led.w.rejections[-1]
    report = check(led.events(), now_ms=at(30))
    assert report.clean, report.violations[:3]


# -- forbid: the policy in force when the firing was decided --------------------------------
def _two_due_under_allow(switch_to_forbid: bool) -> Ledger:
    """An `allow` job whose scheduler was away: a late proposal decides minutes 1 and 2
    at once (both due, both decided under `allow`); then (maybe) a switch to `forbid`;
    then both run, overlapping: minute 2 starts while minute 1 still runs."""
    led = Ledger()
    led.register(spec(misfire="run_all", idempotent=False), T0)
    t1, t2 = at(1), at(2)
    led.w.apply(FireProposed("j", t1, t2 + 5 * SEC, "node-a"))
    assert led.w.runs[rid(t1)].state == led.w.runs[rid(t2)].state == "due"
    if switch_to_forbid:
        led.register(spec(misfire="run_all", idempotent=False, concurrency="forbid"), t2 + 10 * SEC)
        assert led.w.runs[rid(t1)].state == led.w.runs[rid(t2)].state == "due"  # kept
    claimed(led, rid(t1), "w1", t2 + 11 * SEC)
    claimed(led, rid(t2), "w2", t2 + 12 * SEC)
    assert not led.report(RunStarted("j", rid(t1), 1, "w1", t2 + 13 * SEC))
    assert not led.report(RunStarted("j", rid(t2), 1, "w2", t2 + 14 * SEC))
    assert not led.report(RunFinished("j", rid(t1), 1, "w1", 0, "", t2 + 40 * SEC))
    assert not led.report(RunFinished("j", rid(t2), 1, "w2", 0, "", t2 + 50 * SEC))
    return led


def test_runs_decided_under_allow_keep_their_decision_after_a_switch_to_forbid() -> None:
    for switch in (False, True):
        led = _two_due_under_allow(switch)
        report = check_all(led.events(), led.reports, now_ms=at(2) + 55 * SEC)
        assert report.clean, (switch, report.violations[:3])


def test_a_run_decided_under_forbid_beside_an_older_execution_overlaps() -> None:
    """Minute 1, decided under `allow`, is claimed by w1; the job switches to `forbid`;
    w1 starts it, the ledger declares w1 lost and fails it, then decides minute 2 under
    `forbid`, and w2 starts it while w1, never fenced, still runs: an overlap (the
    later-decided run was decided under `forbid`)."""
    led = Ledger()
    led.register(spec(idempotent=False), T0)
    t1, t2 = at(1), at(2)
    led.fire("j", t1, at=t1)
    claimed(led, rid(t1), "w1", t1 + 100)
    led.register(spec(idempotent=False, concurrency="forbid"), t1 + 200)
    assert led.w.runs[rid(t1)].state == "dispatched"  # its time had come: kept
    assert not led.report(RunStarted("j", rid(t1), 1, "w1", t1 + 300))
    led.w.apply(WorkerLost("j", rid(t1), 1, "w1", t1 + 10 * SEC))
    assert led.w.runs[rid(t1)].state == "failed"
    led.fire("j", t2, at=t2)
    assert led.w.runs[rid(t2)].state == "due"
    claimed(led, rid(t2), "w2", t2 + 100)
    assert not led.report(RunStarted("j", rid(t2), 1, "w2", t2 + 300))
    led.report(RunFinished("j", rid(t1), 1, "w1", 0, "", t2 + 5 * SEC))
    report = check_all(led.events(), led.reports, now_ms=t2 + MIN)
    assert kinds(report) == {"overlapping_attempts": 1}, report.violations
    (v,) = report.violations
    assert v.run_id == rid(t1)
    assert f"run of the job for {iso_utc(t2)} (concurrency forbid)" in v.detail


def _forbid_history(t2_events: Sequence[Event], switch: Sequence[Event]) -> list[Event]:
    """A `forbid` job: minute 1 runs on w1 and is failed by the ledger (w1 declared lost)
    at 1:10; `switch` (job events, maybe back to `allow`), then minute 2's events."""
    t1 = at(1)
    return [
        job_event("upserted", T0, spec(concurrency="forbid")),
        run_event(t1, 1, "due", t1),
        run_event(t1, 2, "dispatched", t1 + 100, worker="w1"),
        run_event(t1, 3, "running", t1 + 300, worker="w1"),
        run_event(t1, 4, "failed", t1 + 10 * SEC, worker="w1"),
        *switch,
        *t2_events,
    ]


def test_two_runs_decided_under_forbid_that_overlap_are_reported() -> None:
    """By hand: w1 reports minute 1 ended after w2 started minute 2. Reported when
    minute 2 was decided (created, or revived) under `forbid`; not when it was decided
    under `allow` before a switch back to `forbid`."""
    t1, t2 = at(1), at(2)
    reports: list[LedgerInput] = [
        ClaimRequested("j", rid(t1), 1, "w1", t1 + 100),
        RunStarted("j", rid(t1), 1, "w1", t1 + 300),
        RunFinished("j", rid(t1), 1, "w1", 0, "", t2 + 5 * SEC),
    ]
    ran = [
        run_event(t2, 2, "dispatched", t2 + 100, worker="w2"),
        run_event(t2, 3, "running", t2 + 300, worker="w2"),
        run_event(t2, 4, "succeeded", t2 + 2 * SEC, worker="w2"),
    ]
    created = [run_event(t2, 1, "due", t2), *ran]
    both = _forbid_history(created, [])
    report = check_all(both, reports, now_ms=t2 + MIN)
    assert kinds(report) == {"overlapping_attempts": 1}, report.violations
    assert report.violations[0].run_id == rid(t1)
    # Minute 2 decided under allow (the switch back to forbid came after it): no overlap.
    to_allow = [job_event("upserted", t1 + 20 * SEC, spec())]
    switched = _forbid_history(
        [
            run_event(t2, 1, "due", t2),
            job_event("upserted", t2 + 50, spec(concurrency="forbid")),
            *ran,
        ],
        to_allow,
    )
    assert check_all(switched, reports, now_ms=t2 + MIN).clean
    # Created ahead under allow, withdrawn by the switch, revived at its time under
    # forbid: decided under forbid.
    revived = _forbid_history(
        [
            run_event(t2, 1, "due", t2 - 10 * SEC),
            job_event("upserted", t2 - 5 * SEC, spec(concurrency="forbid")),
            replace(run_event(t2, 2, "cancelled", t2 - 5 * SEC), reason=WITHDRAWN_BY_CHANGE),
            replace(run_event(t2, 3, "due", t2, attempt=2), reason="revived: due again"),
            run_event(t2, 4, "dispatched", t2 + 100, attempt=2, worker="w2"),
            run_event(t2, 5, "running", t2 + 300, attempt=2, worker="w2"),
            run_event(t2, 6, "succeeded", t2 + 2 * SEC, attempt=2, worker="w2"),
        ],
        to_allow,
    )
    report = check_all(revived, reports, now_ms=t2 + MIN)
    assert kinds(report) == {"overlapping_attempts": 1}, report.violations
