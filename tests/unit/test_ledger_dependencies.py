"""Dependencies (docs/architecture.md, "The ledger"): a run waits for its upstreams' runs of
the same period, becomes due when all succeeded and is skipped when one finally did not."""

from __future__ import annotations

from dataclasses import replace

from connectors.audit.checker import AuditConfig, audit
from schemas.records import (
    ClaimRequested,
    DeadlineReached,
    DependencyLinked,
    FireProposed,
    JobPaused,
    JobResumed,
    JobUpserted,
    RunFinished,
    RunStarted,
)
from schemas.spec import EverySchedule, JobSpec
from streams.core.ids import scheduled_run_id
from streams.core.ledger import LedgerConfig
from tests.support.world import World

T0 = 1_800_000_000_000
MIN = 60_000


def job(job_id: str, every: int | None = MIN, depends_on: tuple[str, ...] = ()) -> JobSpec:
    schedule = EverySchedule(every) if every else None
    return JobSpec(
        job_id=job_id, owner="o", schedule=schedule, command=("true",), depends_on=depends_on
    )


def finish(w: World, job_id: str, t: int, code: int, at: int) -> None:
    run_id = scheduled_run_id(job_id, t)
    w.apply(ClaimRequested(job_id, run_id, 1, "w", at))
    w.apply(RunStarted(job_id, run_id, 1, "w", at))
    w.apply(RunFinished(job_id, run_id, 1, "w", code, "", at))


def setup(*specs: JobSpec) -> World:
    w = World()
    for spec in specs:
        w.apply(JobUpserted(spec, T0))
    return w


def test_downstream_waits_then_runs_when_the_upstream_succeeded() -> None:
    w = setup(job("a"), job("b", depends_on=("a",)))
    assert w.jobs["a"].dependents == ("b",)
    t = T0 + MIN
    w.apply(FireProposed("b", t, t, "n"))
    w.apply(FireProposed("a", t, t, "n"))
    assert w.states(scheduled_run_id("b", t)) == ["waiting"]
    finish(w, "a", t, 0, t + 5)
    assert w.states(scheduled_run_id("b", t)) == ["waiting", "due"]
    assert w.dispatch[-1].run_id == scheduled_run_id("b", t)


def test_an_upstream_success_before_the_downstream_run_exists_is_remembered() -> None:
    w = setup(job("a"), job("b", depends_on=("a",)))
    t = T0 + MIN
    w.apply(FireProposed("a", t, t, "n"))
    finish(w, "a", t, 0, t + 1)
    w.apply(FireProposed("b", t, t + 2, "n"))
    assert w.states(scheduled_run_id("b", t)) == ["waiting", "due"]


def test_a_finally_failed_upstream_skips_the_downstream_with_a_reason() -> None:
    w = setup(job("a"), job("b", depends_on=("a",)))
    t = T0 + MIN
    w.apply(FireProposed("a", t, t, "n"))
    w.apply(FireProposed("b", t, t, "n"))
    finish(w, "a", t, 1, t + 5)
    run = w.runs[scheduled_run_id("b", t)]
    assert run.state == "skipped"
    assert run.reason == "upstream a did not succeed"


def test_the_period_is_the_downstreams_interval() -> None:
    # b every 2 min depends on a every minute: b@T needs a's latest run in (T-2m, T].
    w = setup(job("a"), job("b", every=2 * MIN, depends_on=("a",)))
    t = T0 + 2 * MIN
    for k in (1, 2):
        w.apply(FireProposed("a", T0 + k * MIN, T0 + k * MIN, "n"))
    finish(w, "a", T0 + MIN, 0, T0 + MIN + 1)
    w.apply(FireProposed("b", t, t, "n"))
    assert w.runs[scheduled_run_id("b", t)].state == "waiting"  # a@T not finished yet
    finish(w, "a", t, 0, t + 3)
    assert w.runs[scheduled_run_id("b", t)].state == "due"


def test_upstreams_that_never_finish_end_the_wait() -> None:
    w = setup(job("a"), job("b", depends_on=("a",)))
    w.config = LedgerConfig(dependency_wait_ms=10 * MIN)
    t = T0 + MIN
    w.apply(FireProposed("b", t, t, "n"))
    run = w.runs[scheduled_run_id("b", t)]
    assert run.deadline_kind == "dependency"
    assert run.deadline_ms == t + 10 * MIN
    w.apply(DeadlineReached("b", run.run_id, 1, "dependency", t + 10 * MIN))
    assert w.runs[run.run_id].state == "skipped"


def test_a_dag_step_runs_once_per_period_all_upstreams_succeeded() -> None:
    w = setup(job("a1"), job("a2"), job("step", every=None, depends_on=("a1", "a2")))
    t = T0 + MIN
    for upstream in ("a1", "a2"):
        w.apply(FireProposed(upstream, t, t, "n"))
    finish(w, "a1", t, 0, t + 1)
    assert scheduled_run_id("step", t) not in w.runs
    finish(w, "a2", t, 0, t + 2)
    step = w.runs[scheduled_run_id("step", t)]
    assert (step.state, step.trigger) == ("due", "dependency")

    t2 = T0 + 2 * MIN
    for upstream in ("a1", "a2"):
        w.apply(FireProposed(upstream, t2, t2, "n"))
    finish(w, "a1", t2, 1, t2 + 1)
    assert w.runs[scheduled_run_id("step", t2)].state == "skipped"
    finish(w, "a2", t2, 0, t2 + 2)  # too late to matter: the period is decided
    assert w.states(scheduled_run_id("step", t2)) == ["skipped"]


def test_links_survive_the_upstream_registering_later_and_are_removed() -> None:
    w = World()
    w.apply(JobUpserted(job("b", depends_on=("a",)), T0))
    assert w.jobs["a"].deleted  # a placeholder that never fires
    w.apply(JobUpserted(job("a"), T0 + 1))
    assert w.jobs["a"].dependents == ("b",)
    assert not w.jobs["a"].deleted
    w.apply(JobUpserted(replace(job("b"), depends_on=()), T0 + 2))
    assert w.jobs["a"].dependents == ()


# -- a cycle made and undone by the owner (issue 35) ----------------------------------------
def _run_due(w: World, at: int) -> None:
    """Every run due now is claimed, started and finishes well."""
    for run in list(w.runs.values()):
        if run.state == "due":
            for inp in (
                ClaimRequested(run.job_id, run.run_id, run.attempt, "w", at),
                RunStarted(run.job_id, run.run_id, run.attempt, "w", at),
                RunFinished(run.job_id, run.run_id, run.attempt, "w", 0, "", at),
            ):
                w.apply(inp, now=at)


def test_a_cycle_closed_then_undone_creates_no_run_twice_and_audits_clean() -> None:
    """The demo's chain a -> b -> c; `a` made to depend on `c` (no schedule of its own)
    while its next firing was decided ahead, then changed back. The withdrawn firing of
    `a` was reported to `b` as failed, skipped down the chain and came back round the
    cycle as a skip of `a` for the same time: one run created twice, the audit failing."""
    a = job("a")
    w = setup(a, job("b", every=None, depends_on=("a",)), job("c", every=None, depends_on=("b",)))
    for k in (1, 2, 3):
        t = T0 + k * MIN
        w.apply(FireProposed("a", t, t - 20_000, "n"), now=t - 20_000)  # decided ahead
        if k < 3:
            _run_due(w, t + 1000)
    closed = T0 + 2 * MIN + 30_000
    w.apply(JobUpserted(replace(a, schedule=None, depends_on=("c",)), closed), now=closed)
    third = scheduled_run_id("a", T0 + 3 * MIN)
    assert w.states(third) == ["due", "cancelled"]
    # The withdrawn firing never ran: nothing down the chain is decided for its time.
    assert w.run_events(scheduled_run_id("b", T0 + 3 * MIN)) == []
    w.apply(JobUpserted(a, closed + 10_000), now=closed + 10_000)
    for k in (4, 5):
        t = T0 + k * MIN
        w.apply(FireProposed("a", t, t, "n"), now=t)
        _run_due(w, t + 1000)
    created = [e.run_id for e in w.run_events() if e.event_id.endswith(("#0", "#1"))]
    assert len(created) == len(set(created))
    assert w.states(third)[-1] == "succeeded"  # revived: changed back before it ran
    report = audit([(e, 0, i) for i, e in enumerate(w.events)], AuditConfig(), None)
    assert report.counts.get("duplicate_run", 0) == 0
    assert not [v for v in report.violations if v.kind != "not_final"], report.violations


def test_a_cycle_written_past_the_api_is_refused_by_the_ledger_and_named() -> None:
    """`a` changed to depend on `b`, which depends on `a`, straight on the commands topic:
    the link is a probe that `b` passes back to `a`; `a`'s change is refused. Its runs are
    skipped naming the cycle, while `b` (whose upstream `a` runs nothing) is skipped when
    its wait runs out, as with any silent upstream."""
    w = setup(job("a"), job("b", depends_on=("a",)))
    w.apply(JobUpserted(job("a", depends_on=("b",)), T0 + 1))
    assert w.jobs["a"].cycle == ("a", "b", "a")
    assert w.jobs["b"].cycle == ()  # its own change closed nothing
    t = T0 + MIN
    w.apply(FireProposed("a", t, t, "n"))
    run = w.runs[scheduled_run_id("a", t)]
    assert run.state == "skipped"
    assert "dependency cycle a -> b -> a (refused)" in run.reason


def test_two_changes_closing_a_cycle_at_once_are_both_refused() -> None:
    """Neither change sees the other (the API's check would pass both): each link reaches
    the other job after its change, the probes come back to both, both are refused."""
    w = setup(job("a"), job("b"))
    w.deliver_notices = False
    w.apply(JobUpserted(job("a", depends_on=("b",)), T0 + 1))
    w.apply(JobUpserted(job("b", depends_on=("a",)), T0 + 1))
    w.deliver_notices = True
    w.apply(w.outbox.pop(0))
    assert w.jobs["a"].cycle == ("a", "b", "a")
    assert w.jobs["b"].cycle == ("b", "a", "b")


def test_a_refused_job_changed_again_is_probed_again() -> None:
    """While the cycle stands, changing the refused job (any field) refuses it again; once
    the other job no longer closes it, the same change is accepted and runs."""
    w = setup(job("a"), job("b", depends_on=("a",)))
    cyclic = job("a", depends_on=("b",))
    w.apply(JobUpserted(cyclic, T0 + 1))
    w.apply(JobUpserted(replace(cyclic, command=("false",)), T0 + 2))
    assert w.jobs["a"].cycle == ("a", "b", "a")
    w.apply(JobUpserted(job("b"), T0 + 3))  # b no longer depends on a
    w.apply(JobUpserted(cyclic, T0 + 4))
    assert not w.jobs["a"].cycle
    t = T0 + MIN
    w.apply(FireProposed("b", t, t, "n"))
    w.apply(FireProposed("a", t, t, "n"))
    finish(w, "b", t, 0, t + 5)
    assert w.states(scheduled_run_id("a", t)) == ["waiting", "due"]


def test_a_long_cycle_is_found_and_a_diamond_passes_each_probe_once() -> None:
    """c -> (b1, b2) -> a, then a made to depend on c: one probe reaches `a` by two paths
    and goes on once; the cycle is found through one of them."""
    w = setup(
        job("a"),
        job("b1", depends_on=("a",)),
        job("b2", depends_on=("a",)),
        job("c", depends_on=("b1", "b2")),
    )
    w.deliver_notices = False
    w.apply(JobUpserted(job("a", depends_on=("c",)), T0 + 1))
    passed: list[tuple[str, tuple[str, ...]]] = []
    while w.outbox:
        notice = w.outbox.pop(0)
        if isinstance(notice, DependencyLinked) and notice.trail:
            passed.append((notice.job_id, notice.trail))
        w.apply(notice)
    assert w.jobs["a"].cycle in {("a", "c", "b1", "a"), ("a", "c", "b2", "a")}
    # c passes the probe to b1 and b2, each to a; a (its origin) passes nothing on.
    assert sorted(passed) == [
        ("a", ("a", "c", "b1")),
        ("a", ("a", "c", "b2")),
        ("b1", ("a", "c")),
        ("b2", ("a", "c")),
    ]


def test_a_probe_to_a_job_not_registered_leaves_no_placeholder() -> None:
    w = setup(job("a", depends_on=("ghost",)))
    assert w.jobs["ghost"].deleted  # the link's placeholder
    w.apply(DependencyLinked("nobody", "a", True, T0 + 1, "o", ("a", "ghost")))
    assert "nobody" not in w.jobs


def test_a_cycle_of_another_owners_job_is_not_probed_through() -> None:
    """A probe passes only along its owner's links: it never tells one owner's job about
    another's graph."""
    w = setup(job("a"), job("b", depends_on=("a",)))
    w.apply(DependencyLinked("b", "x", True, T0 + 1, "intruder", ("x",)))
    assert w.jobs["b"].probes == ()


def test_a_withdrawn_upstream_firing_skips_no_dependent() -> None:
    """A pause withdraws `a`'s firing created ahead: `b`'s run for that time keeps
    waiting (it is decided by `a`'s next outcome or the dependency wait), since a resume
    before the time revives the firing and runs it."""
    w = setup(job("a"), job("b", depends_on=("a",)))
    t = T0 + MIN
    w.apply(FireProposed("b", t, t - 10_000, "n"), now=t - 10_000)
    w.apply(FireProposed("a", t, t - 10_000, "n"), now=t - 10_000)
    w.apply(JobPaused("a", t - 5_000), now=t - 5_000)
    assert w.states(scheduled_run_id("a", t)) == ["due", "cancelled"]
    assert w.states(scheduled_run_id("b", t)) == ["waiting"]
    w.apply(JobResumed("a", t - 2_000), now=t - 2_000)
    w.apply(FireProposed("a", t, t, "n"), now=t)
    assert w.states(scheduled_run_id("a", t))[-1] == "due"  # revived, a new attempt
    _run_due(w, t + 5)
    assert w.states(scheduled_run_id("a", t))[-1] == "succeeded"
    assert w.states(scheduled_run_id("b", t))[:2] == ["waiting", "due"]


def test_a_step_waiting_on_a_silent_upstream_is_decided_when_its_wait_runs_out() -> None:
    """a2 is paused and never reports again; a1 goes on, failing once. The step's first
    period waits for a2 (and the failure after it waits behind it) until the dependency
    wait runs out; no notice comes then, so the step is proposed at that time (its
    next_due_ms) and decides every period whose wait has run out."""
    wait = 10 * MIN
    w = setup(job("a1"), job("a2"), job("step", every=None, depends_on=("a1", "a2")))
    w.config = replace(w.config, dependency_wait_ms=wait)
    w.apply(JobPaused("a2", T0 + 1))
    t1, t2 = T0 + MIN, T0 + 2 * MIN
    for t, code in ((t1, 0), (t2, 1)):
        w.apply(FireProposed("a1", t, t, "n"))
        finish(w, "a1", t, code, t + 1)
    w.apply(JobPaused("a1", t2 + 2))  # no upstream speaks again
    step = w.jobs["step"]
    assert step.next_due_ms == t1 + wait + 1
    assert w.run_events(scheduled_run_id("step", t1)) == []
    early = t1 + wait
    w.apply(FireProposed("step", t1 + wait + 1, early, "n"), now=early)
    assert w.rejections[-1].startswith("proposed before its time")
    due = t1 + wait + 1
    w.apply(FireProposed("step", due, due, "n"), now=due)
    assert w.states(scheduled_run_id("step", t1)) == ["skipped"]
    assert w.states(scheduled_run_id("step", t2)) == ["skipped"]
    assert w.jobs["step"].next_due_ms is None  # nothing left open
