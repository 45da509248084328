"""The audit says the ledger's rule on a re-created job (simulation seed 337): it starts
afresh, but never below what its old life decided. The ledger re-creates a job deleted
at d with the watermark max(r, K), K the newest firing after d of the old life that was
not withdrawn (a run started before the deletion reached the ledger, a firing recorded
skipped): a new schedule's times up to K are not due. The audit's interval of the new
life starts there too (connectors/audit/firings.py, `re_created`), conservatively: a
withdrawal still pending at the re-creation is not on run-events, so the audit counts
that firing as decided (a later K than the ledger's, fewer firings expected).

Histories are built by hand (the records as the audit reads them) and driven through
the real ledger (tests/support/world.py).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from schemas.records import JobDeleted, JobUpserted, RunEvent
from schemas.spec import CronSchedule, JobSpec
from streams.core.ledger.decision import WITHDRAWN_BY_DELETE
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
from tests.unit.test_audit_limits import at, missing_minutes


def at_50(minute: int) -> int:
    """The new schedule's fire time in `minute`: its second 50."""
    return at(minute) - 10 * SEC + MIN


NEW = spec(schedule=CronSchedule("50 * * * * *", "UTC"))  # fires at second 50
T = at(3)  # the old life's firing after the deletion
D = T - 30 * SEC  # the deletion, effective 30 s before it
R = T - 20 * SEC  # the re-creation: the new schedule's 2:50 is in (R, T]


def withdrawn(t: int, seq: int, at_ms: int, reason: str = WITHDRAWN_BY_DELETE) -> RunEvent:
    return replace(run_event(t, seq, "cancelled", at_ms), reason=reason)


# What the old life recorded for T (at its own seq numbers) before the re-creation: a
# firing decided once (kept), or withdrawn ahead of its time.
SKIPPED = [run_event(T, 0, "skipped", T + 5 * SEC)]  # a late decision: misfire
STARTED = [  # started before the deletion reached the ledger
    run_event(T, 1, "due", T - 40 * SEC),
    run_event(T, 2, "dispatched", T - 35 * SEC, worker="w"),
    run_event(T, 3, "running", T + 300, worker="w"),
]
HAD_STARTED = [  # the withdrawal found it started: not a withdrawal
    run_event(T, 1, "due", T - 40 * SEC),
    run_event(T, 2, "dispatched", T - 35 * SEC, worker="w"),
    withdrawn(T, 3, T + SEC, f"{WITHDRAWN_BY_DELETE} (it had started)"),
]
WITHDRAWN = [run_event(T, 1, "due", T - 40 * SEC), withdrawn(T, 2, D)]
# Created ahead, claimed; the deletion withdrew it, its holder had not answered yet.
PENDING = [
    run_event(T, 1, "due", T - 40 * SEC),
    run_event(T, 2, "dispatched", T - 35 * SEC, worker="w"),
]


def re_created(old: list[RunEvent], *, new_minutes: range = range(3, 9)) -> list[Event]:
    """Minutes 1 and 2 run; `old` for minute 3; deleted at D (in log order after `old`:
    the ledger wrote those records before the deletion reached it); re-created at R with
    NEW, whose firings at second 50 of `new_minutes` run."""
    events: list[Event] = [job_event("upserted", T0, spec())]
    events += life(at(1)) + life(at(2)) + old
    events += [job_event("deleted", D), job_event("upserted", R, NEW)]
    for minute in new_minutes:
        events += life(at_50(minute))
    return events


@pytest.mark.parametrize(
    "old", [SKIPPED, STARTED, HAD_STARTED], ids=["skipped", "started", "had-started"]
)
def test_a_re_created_job_fires_only_above_what_its_old_life_decided(
    old: list[RunEvent],
) -> None:
    """Seed 337's history: 2:50, of the new schedule, is at or below the firing at 3:00
    the old life decided: not due (the ledger rejects it: "already decided")."""
    events = re_created(old)
    report = check(events, now_ms=at(11))
    assert report.clean, report.violations[:3]
    # The firings due: minutes 1 and 2, then 3:50 .. 8:50 (9:50 is in the margin).
    assert report.expected_firings == 2 + 6


def test_a_firing_missing_above_what_the_old_life_decided_is_reported() -> None:
    """The new life starts at 3:00: 3:50 is due, and its missing run is reported."""
    events = re_created(SKIPPED, new_minutes=range(4, 9))
    assert missing_minutes(events, now_ms=at(11)) == [(at_50(3) - T0) / MIN]
    (v,) = check(events, now_ms=at(11)).violations
    assert "active since 2027-01-15T08:03:00Z" in v.detail
    # Every later one too, once the new life stops firing.
    events = re_created(SKIPPED, new_minutes=range(3, 5))
    missing = missing_minutes(events, now_ms=at(11))
    assert missing == [(at_50(m) - T0) / MIN for m in range(5, 9)]


def test_a_withdrawn_firing_of_the_old_life_leaves_the_new_times_due() -> None:
    """Minute 3 withdrawn by the deletion: the stub's watermark stays at D, the new
    life starts at R, and 2:50 is due: without its run, reported."""
    assert check(re_created(WITHDRAWN, new_minutes=range(2, 9)), now_ms=at(11)).clean
    events = re_created(WITHDRAWN)
    assert missing_minutes(events, now_ms=at(11)) == [(at_50(2) - T0) / MIN]


def test_a_withdrawal_pending_at_the_re_creation_counts_as_decided() -> None:
    """The audit's one conservative rule: minute 3's run, claimed, was withdrawn by the
    deletion but its holder answers only after the re-creation. The ledger left it out
    (its stop order is not on run-events): it fires 2:50; the audit, which cannot tell
    that claim from one its holder started, does not expect 2:50: clean with or without
    it."""
    answer = withdrawn(T, 3, R + SEC)
    for first in (2, 3):
        events = re_created(PENDING, new_minutes=range(first, 9))
        events.insert(events.index(job_event("upserted", R, NEW)) + 1, answer)
        report = check(events, now_ms=at(11))
        assert report.clean, report.violations[:3]
    # Answered before the re-creation: a withdrawal, and 2:50 is due.
    events = re_created([*PENDING, answer])
    assert missing_minutes(events, now_ms=at(11)) == [(at_50(2) - T0) / MIN]


def _ledger_re_created(new: JobSpec) -> Ledger:
    """Through the ledger: minutes 1 and 2 run; minute 3's run, created ahead, starts
    before the deletion, stamped 5 s before it, reaches the ledger; re-created (stamped
    3 s before it) with `new`."""
    led = Ledger()
    led.register(spec(), at(0))
    for minute in (1, 2, 3):
        led.cycle("j", at(minute))
    led.w.apply(JobDeleted("j", T - 5 * SEC), now=T + 3 * SEC)
    led.w.apply(JobUpserted(new, T - 3 * SEC), now=T + 4 * SEC)
    return led


def test_the_ledger_re_creates_a_job_above_a_run_started_before_the_deletion() -> None:
    """The new schedule fires at second 59: the ledger fires 2:59, a time of the new
    life after its re-creation (the old life's 3:00 keeps its run in the stub); the
    audit, conservative there, does not expect it but accepts it; 3:59 is due."""
    led = _ledger_re_created(spec(schedule=CronSchedule("59 * * * * *", "UTC")))
    assert led.w.jobs["j"].fired_ms == T - 3 * SEC
    assert rid(T) in led.w.runs  # kept in the stub: above the deletion's time
    led.fire("j", T - SEC, at=T + 5 * SEC)
    assert rid(T - SEC) in led.w.runs
    for minute in range(4, 10):
        led.cycle("j", at(minute) - SEC)
    report = check_all(led.events(), led.reports, now_ms=at(11))
    assert report.clean, report.violations[:3]
    assert report.expected_firings == 2 + 6  # minutes 1 and 2, then 3:59 .. 8:59
    # Without the run for 3:59: reported.
    events = [
        e for e in led.events() if not (isinstance(e, RunEvent) and e.run_id == rid(at(4) - SEC))
    ]
    assert kinds(check(events, now_ms=at(11))) == {"missing_firing": 1}


def test_the_ledger_fires_below_a_withdrawal_still_pending_and_the_audit_accepts_it() -> None:
    """Minute 3's run, claimed ahead, is withdrawn by the deletion; its holder answers
    after the re-creation. The ledger fires the new schedule's 2:59 (its watermark is
    the re-creation's time): the audit, which takes the claim as decided, accepts it."""
    led = Ledger()
    led.register(spec(), at(0))
    for minute in (1, 2):
        led.cycle("j", at(minute))
    led.fire("j", T)
    claimed(led, rid(T), "w1", T - 9 * SEC)
    led.w.apply(JobDeleted("j", T - 5 * SEC))
    led.w.apply(JobUpserted(spec(schedule=CronSchedule("59 * * * * *", "UTC")), T - 4 * SEC))
    assert led.w.jobs["j"].fired_ms == T - 4 * SEC
    led.fire("j", T - SEC, at=T - 2 * SEC)
    assert rid(T - SEC) in led.w.runs
    assert led.w.runs[rid(T)].state == "dispatched"
    report = check_all(led.events(), led.reports, now_ms=T + MIN)
    assert report.clean, report.violations[:3]
