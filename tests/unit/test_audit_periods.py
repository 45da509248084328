"""The audit's DAG periods (``missing_period``, connectors/audit/periods.py) say the
ledger's rule on upstreams of another owner: a job depends only on jobs of its own owner,
so an upstream of another owner never tells a step of its outcomes (it refuses the
step's link; an id that was a placeholder when the step named it, registered later by
another owner, has its notices refused by the step). Its outcomes decide no period of
the step, and the audit expects no record for them.

Driven through the real ledger (tests/support/world.py), as in tests/unit/test_audit.py.
"""

from __future__ import annotations

from dataclasses import replace

from connectors.audit.config import AuditConfig
from schemas.records import (
    ClaimRequested,
    JobPaused,
    RunEvent,
    RunFinished,
    RunStarted,
)
from schemas.spec import EverySchedule, JobSpec, RetryPolicy
from tests.unit.test_audit import MIN, T0, Ledger, check_all, rid, spec

EVERY = 10 * MIN


def upstream(job_id: str, owner: str = "o") -> JobSpec:
    """Every 10 minutes, one attempt per run."""
    once = RetryPolicy(max_attempts=1)
    return spec(job_id, owner=owner, schedule=EverySchedule(EVERY), retry=once)


def _run(led: Ledger, job: str, k: int, ok: bool) -> None:
    t = T0 + k * EVERY
    led.fire(job, t)
    led.execute(job, t, exit_code=0 if ok else 1)


def _step_records(led: Ledger) -> list[RunEvent]:
    return [e for e in led.events() if isinstance(e, RunEvent) and e.job_id == "s"]


def test_a_step_is_told_nothing_by_an_upstream_of_another_owner() -> None:
    """s (owner o) names a (owner p), registered first: a refuses the link, so its
    failures owe s no skip record (nor its successes a run)."""
    led = Ledger()
    led.register(upstream("a", "p"), T0)
    led.register(spec("s", schedule=None, depends_on=("a",)), T0 + 1)
    assert any("cannot depend on a of owner 'p'" in r for r in led.w.rejections)
    for k in range(1, 6):
        _run(led, "a", k, ok=k % 2 == 0)
    assert not _step_records(led)
    report = check_all(led.events(), led.reports, now_ms=T0 + 58 * MIN)
    assert report.clean, report.violations[:3]


def test_an_upstream_registered_later_by_another_owner_is_refused_by_the_step() -> None:
    """s names a before a exists (the link waits at a's placeholder); another owner then
    registers a: s refuses a's notices, and the audit expects nothing of them."""
    led = Ledger()
    led.register(spec("s", schedule=None, depends_on=("a",)), T0)
    led.register(upstream("a", "p"), T0 + 1)
    for k in range(1, 6):
        _run(led, "a", k, ok=k % 2 == 0)
    assert any("a belongs to owner 'p'" in r for r in led.w.rejections)
    assert not _step_records(led)
    report = check_all(led.events(), led.reports, now_ms=T0 + 58 * MIN)
    assert report.clean, report.violations[:3]


def test_a_step_with_an_upstream_of_another_owner_skips_only_its_own_owners_failures() -> None:
    """s (owner o) on a1 (owner o) and a2 (owner p), with a 5-minute dependency wait:
    a2's outcomes never reach s, so a period of a1's success waits for a2 and is skipped
    when the wait runs out, and a1's failure, with no earlier period open, is skipped at
    once. a2's failure at a time a1 (paused) does not run owes s nothing. The
    audit agrees, and still reports a dropped skip record of a1's failure."""
    wait = 5 * MIN
    led = Ledger()
    led.w.config = replace(led.w.config, dependency_wait_ms=wait)
    config = AuditConfig(dependency_wait_ms=wait)
    led.register(upstream("a1"), T0)
    led.register(upstream("a2", "p"), T0)
    led.register(spec("s", schedule=None, depends_on=("a1", "a2")), T0 + 1)
    for k in range(1, 8):
        if k < 6:
            _run(led, "a1", k, ok=k in (2, 5))
        _run(led, "a2", k, ok=k % 2 == 1)
        due = led.w.jobs["s"].next_due_ms
        if due is not None:  # the scheduler proposes the step when the wait runs out
            led.fire("s", due, at=due)
        if k == 5:
            led.w.apply(JobPaused("a1", T0 + 55 * MIN))
    records = {e.scheduled_ms: e.reason for e in _step_records(led) if e.state == "skipped"}
    assert sorted(records) == [T0 + k * EVERY for k in range(1, 6)]
    assert records[T0 + 2 * EVERY] == "upstream a2 did not finish in time"
    assert records[T0 + 3 * EVERY] == "upstream a1 did not succeed"
    now = T0 + 75 * MIN
    report = check_all(led.events(), led.reports, config, now_ms=now)
    assert report.clean, report.violations[:3]
    # A skip record of a1's failure dropped: still a missing period.
    dropped = rid(T0 + 3 * EVERY, "s")
    events = [e for e in led.events() if not (isinstance(e, RunEvent) and e.run_id == dropped)]
    report = check_all(events, led.reports, config, now_ms=now)
    assert [(v.kind, v.run_id) for v in report.violations] == [
        ("missing_period", rid(T0 + 3 * EVERY, "a1"))
    ]


def test_a_change_of_a_step_keeps_the_wait_of_its_open_period() -> None:
    """s on a1 and a2 (silent), with a 15-minute dependency wait: a1's success at 10
    waits for a2, and a1's failure at 20 waits behind it. A change of s (its retry) must
    keep the step's `next_due_ms`, the end of that wait: the scheduler proposes it then,
    and both periods are skipped. (The ledger set it from the schedule, None for a step,
    and the periods stayed open for ever: seeds 2967 and 6092 of the simulation.)"""
    wait = 15 * MIN
    led = Ledger()
    led.w.config = replace(led.w.config, dependency_wait_ms=wait)
    config = AuditConfig(dependency_wait_ms=wait)
    led.register(upstream("a1"), T0)
    led.register(upstream("a2"), T0)
    led.register(spec("s", schedule=None, depends_on=("a1", "a2")), T0 + 1)
    led.w.apply(JobPaused("a2", T0 + 2))
    _run(led, "a1", 1, ok=True)
    _run(led, "a1", 2, ok=False)
    led.w.apply(JobPaused("a1", T0 + 21 * MIN))
    due = led.w.jobs["s"].next_due_ms
    assert due == T0 + EVERY + wait + 1
    led.register(
        spec("s", schedule=None, depends_on=("a1", "a2"), retry=RetryPolicy(max_attempts=3)),
        due - 1,
    )
    assert led.w.jobs["s"].next_due_ms == due
    led.fire("s", due, at=due)
    records = {e.scheduled_ms: e.reason for e in _step_records(led) if e.state == "skipped"}
    assert records == {
        T0 + EVERY: "upstream a2 did not finish in time",
        T0 + 2 * EVERY: "upstream a1 did not succeed",
    }
    report = check_all(led.events(), led.reports, config, now_ms=T0 + 60 * MIN)
    assert report.clean, report.violations[:3]


def test_a_switch_of_a_step_to_forbid_keeps_its_periods() -> None:
    """s on a: a switch of s to `replace` while a's run for 10 is running does not move
    the step's watermark past 10 (a step has no firings created ahead to withdraw), so
    a's failure, told after the change, is still recorded as skipped (seed 3793 of the
    simulation: the change dropped it), and the next success runs the step."""
    led = Ledger()
    led.register(upstream("a"), T0)
    led.register(spec("s", schedule=None, depends_on=("a",)), T0 + 1)
    t = T0 + EVERY
    led.fire("a", t)
    run = rid(t, "a")
    led.report(ClaimRequested("a", run, 1, "w1", t))
    led.report(RunStarted("a", run, 1, "w1", t + 300))
    switched = spec("s", schedule=None, depends_on=("a",), concurrency="replace")
    led.register(switched, t + 1_000)
    led.report(RunFinished("a", run, 1, "w1", 1, "", t + 2_000))
    _run(led, "a", 2, ok=True)
    led.w.apply(JobPaused("a", T0 + 21 * MIN))
    states: dict[int, str] = {}
    for e in _step_records(led):
        states.setdefault(e.scheduled_ms, e.state)  # its first record
    assert states == {t: "skipped", t + EVERY: "due"}
    report = check_all(led.events(), led.reports, now_ms=T0 + 58 * MIN)
    assert report.clean, report.violations[:3]


def test_max_runs_never_holds_a_steps_periods_open() -> None:
    """A step with max_runs 1 whose one run is made: its end-of-wait proposal is still
    taken (max_runs limits a schedule's firings, never a step's periods), so a period an
    upstream never reports is skipped when the wait runs out, and `next_due_ms` is not
    cleared by the limit."""
    wait = 15 * MIN
    led = Ledger()
    led.w.config = replace(led.w.config, dependency_wait_ms=wait)
    config = AuditConfig(dependency_wait_ms=wait)
    led.register(upstream("a1"), T0)
    led.register(upstream("a2"), T0)
    led.register(spec("s", schedule=None, depends_on=("a1", "a2"), max_runs=1), T0 + 1)
    led.w.jobs["s"] = replace(led.w.jobs["s"], schedule_runs=1)  # its one run was made
    led.w.apply(JobPaused("a2", T0 + 2))
    _run(led, "a1", 1, ok=True)
    led.w.apply(JobPaused("a1", T0 + 11 * MIN))
    due = led.w.jobs["s"].next_due_ms
    assert due == T0 + EVERY + wait + 1
    led.fire("s", due, at=due)
    records = {e.scheduled_ms: e.reason for e in _step_records(led) if e.state == "skipped"}
    assert records == {T0 + EVERY: "upstream a2 did not finish in time"}
    report = check_all(led.events(), led.reports, config, now_ms=T0 + 60 * MIN)
    assert report.clean, report.violations[:3]
