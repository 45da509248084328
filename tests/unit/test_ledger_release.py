"""Attempts claimed but never started go back to dispatch (pure: no Kafka).

A worker releases an attempt it holds and will never start (`RunReleased`); a worker
declared dead before an attempt's start time cannot have started it (`WorkerLost` with
`at_ms` before the run's not-before). Either way the run is `due` again for the same
attempt: no retry is consumed. A verdict at or after the start time keeps the old rule.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from connectors.audit.checker import AuditConfig, audit
from schemas.records import (
    CancelOrder,
    ClaimReply,
    ClaimRequested,
    DeadlineReached,
    FireProposed,
    JobUpserted,
    RunEvent,
    RunFinished,
    RunReleased,
    RunStarted,
    RunState,
    WorkerLost,
)
from schemas.spec import EverySchedule, JobSpec, RetryPolicy
from streams.core.ids import scheduled_run_id
from streams.core.ledger import LedgerConfig
from streams.core.schedule import jitter_ms
from tests.support.world import World

T0 = 1_800_000_000_000  # a multiple of 60 s
MIN = 60_000
T = T0 + MIN  # the firing every test uses
AHEAD = T - 45_000  # decided and claimed ahead of its time (look-ahead)
CLAIM_TIMEOUT = LedgerConfig().claim_timeout_ms
GRACE = LedgerConfig().timeout_grace_ms
RUN = scheduled_run_id("j", T)


def spec(**changes: object) -> JobSpec:
    base = JobSpec(
        job_id="j",
        owner="o",
        schedule=EverySchedule(MIN),
        command=("true",),
        timeout_s=60,
        # A job that may not run twice, and has one attempt: any loss would fail it.
        idempotent=False,
        retry=RetryPolicy(max_attempts=1),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def claimed(worker: str = "w1", **changes: object) -> World:
    """Job j, its run for T decided 45 s ahead and claimed by `worker` at once."""
    w = World()
    w.apply(JobUpserted(spec(**changes), T0))
    w.apply(FireProposed("j", T, AHEAD, "a"))
    reply = w.apply(ClaimRequested("j", RUN, 1, worker, AHEAD + 100)).replies
    assert [(r.worker_id, r.granted) for r in reply if isinstance(r, ClaimReply)] == [
        (worker, True)
    ]
    assert w.runs[RUN].state == "dispatched"
    return w


def grants(w: World, worker: str, at: int, attempt: int = 1) -> list[bool]:
    d = w.apply(ClaimRequested("j", RUN, attempt, worker, at))
    return [r.granted for r in d.replies if isinstance(r, ClaimReply)]


def finish(w: World, worker: str, start: int, attempt: int = 1) -> None:
    assert w.apply(RunStarted("j", RUN, attempt, worker, start)).runs[0].state == "running"
    w.apply(RunFinished("j", RUN, attempt, worker, 0, "", start + 1_000))
    assert w.runs[RUN].state == "succeeded"


# -- RunReleased ----------------------------------------------------------------------------
def test_the_run_keeps_its_start_time() -> None:
    w = claimed()
    run = w.runs[RUN]
    assert run.not_before_ms == T
    # The timeout backstop counts from the start time, not from the early claim.
    assert run.deadline_kind == "timeout"
    assert run.deadline_ms == T + 60_000 + GRACE


def test_a_release_makes_the_same_attempt_due_and_dispatches_it_again() -> None:
    w = claimed()
    at = AHEAD + 5_000
    d = w.apply(RunReleased("j", RUN, 1, "w1", "no room at its start time", at))
    assert d.rejected == ""
    (run,) = d.runs
    assert (run.state, run.attempt, run.worker_id) == ("due", 1, "")
    assert (run.deadline_kind, run.deadline_ms) == ("claim", T + CLAIM_TIMEOUT)
    assert run.not_before_ms == T
    (event,) = d.events
    assert isinstance(event, RunEvent)
    assert (event.state, event.attempt, event.worker_id, event.at_ms) == ("due", 1, "", at)
    assert event.reason == "released by worker w1: no room at its start time"
    (request,) = d.dispatch
    assert (request.run_id, request.attempt, request.scheduled_ms) == (RUN, 1, T)
    assert request.not_before_ms == T  # still not before its time
    assert request.at_ms == at
    assert d.replies == ()  # the worker released it itself: no stop order
    assert w.states(RUN) == ["due", "dispatched", "due"]


def test_a_release_after_the_start_time_is_dispatched_for_now() -> None:
    w = claimed()
    at = T + 2_000
    d = w.apply(RunReleased("j", RUN, 1, "w1", "", at))
    assert d.runs[0].reason == "released by worker w1: dispatched again"
    assert d.dispatch[0].not_before_ms == at
    assert d.runs[0].deadline_ms == at + CLAIM_TIMEOUT


def test_a_released_attempt_may_be_claimed_again_by_another_worker() -> None:
    w = claimed()
    w.apply(RunReleased("j", RUN, 1, "w1", "fenced", AHEAD + 5_000))
    assert grants(w, "w2", AHEAD + 6_000) == [True]
    assert w.runs[RUN].worker_id == "w2"
    assert grants(w, "w1", AHEAD + 7_000) == [False]  # first claim wins again
    # The releasing worker's reports are stale now.
    assert "release by w1" in w.apply(RunReleased("j", RUN, 1, "w1", "", AHEAD + 8_000)).rejected
    assert not w.apply(RunStarted("j", RUN, 1, "w1", T)).changed
    finish(w, "w2", T + 5)
    assert w.states(RUN) == ["due", "dispatched", "due", "dispatched", "running", "succeeded"]
    assert {e.attempt for e in w.run_events(RUN)} == {1}


def test_a_released_attempt_may_be_claimed_again_by_the_same_worker() -> None:
    w = claimed()
    w.apply(RunReleased("j", RUN, 1, "w1", "restarted", AHEAD + 5_000))
    assert grants(w, "w1", AHEAD + 6_000) == [True]
    assert w.runs[RUN].state == "dispatched"
    finish(w, "w1", T + 5)


@pytest.mark.parametrize(
    ("record", "expected"),
    [
        (RunReleased("j", RUN, 1, "w2", "", AHEAD + 1_000), "release by w2 while dispatched on w1"),
        (RunReleased("j", RUN, 2, "w1", "", AHEAD + 1_000), "stale attempt 2 (current 1)"),
        (RunReleased("j", RUN, 0, "w1", "", AHEAD + 1_000), "stale attempt 0 (current 1)"),
        (RunReleased("j", "j@nope", 1, "w1", "", AHEAD + 1_000), "run is not live"),
        (RunReleased("nope", RUN, 1, "w1", "", AHEAD + 1_000), "unknown job nope"),
    ],
    ids=["other-worker", "newer-attempt", "older-attempt", "unknown-run", "unknown-job"],
)
def test_a_release_by_a_non_holder_is_rejected(record: RunReleased, expected: str) -> None:
    w = claimed()
    before = w.runs[RUN]
    d = w.apply(record)
    assert expected in d.rejected
    assert not d.changed
    assert d.dispatch == ()
    assert w.runs[RUN] == before


def test_a_release_of_a_running_attempt_is_rejected() -> None:
    w = claimed()
    w.apply(RunStarted("j", RUN, 1, "w1", T + 3))
    d = w.apply(RunReleased("j", RUN, 1, "w1", "", T + 50))
    assert d.rejected == "release by w1 while running on w1"
    assert not d.changed
    assert w.runs[RUN].state == "running"


def test_a_release_of_an_unclaimed_or_final_run_is_rejected() -> None:
    w = claimed()
    w.apply(RunReleased("j", RUN, 1, "w1", "", AHEAD + 1_000))
    again = w.apply(RunReleased("j", RUN, 1, "w1", "", AHEAD + 1_001))  # a duplicate
    assert again.rejected == "release by w1 while due on nobody"
    assert again.dispatch == ()
    assert grants(w, "w2", AHEAD + 2_000) == [True]
    finish(w, "w2", T + 5)
    late = w.apply(RunReleased("j", RUN, 1, "w2", "", T + 2_000))
    assert late.rejected == "run is not live"


def test_a_release_consumes_no_retry_and_attempts_count_on() -> None:
    w = claimed(idempotent=True, retry=RetryPolicy(max_attempts=2, backoff_s=1))
    w.apply(RunReleased("j", RUN, 1, "w1", "", AHEAD + 1_000))
    assert grants(w, "w2", AHEAD + 2_000) == [True]
    w.apply(RunStarted("j", RUN, 1, "w2", T))
    w.apply(RunFinished("j", RUN, 1, "w2", 1, "", T + 100))
    run = w.runs[RUN]
    assert (run.state, run.attempt) == ("retrying", 1)  # the second attempt is still there
    assert run.deadline_ms is not None
    d = w.apply(DeadlineReached("j", RUN, 1, "retry", run.deadline_ms))
    assert d.runs[0].attempt == 2
    assert d.runs[0].not_before_ms == run.deadline_ms


# -- WorkerLost before the start time -------------------------------------------------------
def test_a_worker_declared_dead_before_the_start_time_releases_the_attempt() -> None:
    w = claimed()
    verdict = T - 20_000  # the worker died at :59:30 or so, the run is due at :00
    d = w.apply(WorkerLost("j", RUN, 1, "w1", verdict))
    (run,) = d.runs
    assert (run.state, run.attempt, run.worker_id) == ("due", 1, "")
    assert run.reason == "worker w1 lost before the run's start: dispatched again"
    assert (run.deadline_kind, run.deadline_ms) == ("claim", T + CLAIM_TIMEOUT)
    (request,) = d.dispatch
    assert (request.attempt, request.not_before_ms) == (1, T)
    # Should the dead worker come back, it drops the attempt.
    assert d.replies == (CancelOrder("w1", RUN, 1, "declared lost", verdict),)
    # A non-idempotent job with a single attempt still runs, elsewhere.
    assert grants(w, "w2", verdict + 1_000) == [True]
    finish(w, "w2", T + 5)
    assert w.states(RUN) == ["due", "dispatched", "due", "dispatched", "running", "succeeded"]


def test_a_stale_verdict_after_the_release_changes_nothing() -> None:
    w = claimed()
    w.apply(WorkerLost("j", RUN, 1, "w1", T - 20_000))
    assert grants(w, "w2", T - 19_000) == [True]
    d = w.apply(WorkerLost("j", RUN, 1, "w1", T - 18_000))
    assert d.rejected == "worker w1 does not hold this attempt"
    assert w.runs[RUN].worker_id == "w2"


@pytest.mark.parametrize("verdict", [T, T + 1, T + 5 * MIN])
def test_a_worker_declared_dead_at_or_after_the_start_time_loses_the_attempt(verdict: int) -> None:
    w = claimed()
    d = w.apply(WorkerLost("j", RUN, 1, "w1", verdict))
    assert w.runs[RUN].state == "failed"
    assert w.runs[RUN].reason == "lost: worker w1"
    assert d.dispatch == ()
    assert d.replies == (CancelOrder("w1", RUN, 1, "declared lost", verdict),)


def test_a_run_due_after_the_dead_workers_lease_ended_is_released() -> None:
    """The verdict comes after the run's time, but the worker's lease had ended before
    it (the broker's time of its last beat plus the lease): it never started the run,
    so a non-idempotent job with one attempt still runs, elsewhere, not `lost`."""
    w = claimed()
    verdict, lease_ended = T + 4_000, T - 2_000
    d = w.apply(WorkerLost("j", RUN, 1, "w1", verdict, lease_ended))
    (run,) = d.runs
    assert (run.state, run.attempt, run.worker_id) == ("due", 1, "")
    assert run.reason == "worker w1 lost before the run's start: dispatched again"
    (request,) = d.dispatch
    assert (request.attempt, request.not_before_ms) == (1, verdict)  # due now, not at T
    assert grants(w, "w2", verdict + 500) == [True]
    finish(w, "w2", verdict + 600)
    assert w.runs[RUN].state == "succeeded"


@pytest.mark.parametrize("lease_ended", [T, T + 1, T + 3_000])
def test_a_run_due_before_the_dead_workers_lease_ended_may_have_started(lease_ended: int) -> None:
    w = claimed()
    w.apply(WorkerLost("j", RUN, 1, "w1", T + 4_000, lease_ended))
    assert (w.runs[RUN].state, w.runs[RUN].reason) == ("failed", "lost: worker w1")


def test_a_lease_bound_after_the_verdict_changes_nothing() -> None:
    """A bound later than the verdict itself (a dispatcher clock behind the broker's)
    cannot widen what the verdict's own time proves."""
    w = claimed()
    w.apply(WorkerLost("j", RUN, 1, "w1", T + 1_000, T + 60_000))
    assert w.runs[RUN].state == "failed"


def test_a_worker_lost_after_the_start_time_retries_an_idempotent_job() -> None:
    w = claimed(idempotent=True, retry=RetryPolicy(max_attempts=2, backoff_s=1))
    w.apply(WorkerLost("j", RUN, 1, "w1", T + 1_000))
    run = w.runs[RUN]
    assert (run.state, run.attempt) == ("retrying", 1)
    assert run.reason == "lost: worker w1"


def test_a_worker_lost_while_running_is_lost_even_before_the_start_time() -> None:
    # Only a `dispatched` attempt can be known not to have started.
    w = claimed()
    w.apply(RunStarted("j", RUN, 1, "w1", T - 30_000))  # a start the ledger was told of
    w.apply(WorkerLost("j", RUN, 1, "w1", T - 20_000))
    assert w.runs[RUN].state == "failed"


def test_the_start_time_includes_the_jitter() -> None:
    jitter = jitter_ms("j", T, 30)
    assert jitter > 2_000  # the hash gives this firing a jitter worth testing
    w = claimed(jitter_s=30)
    start = T + jitter
    run = w.runs[RUN]
    assert run.not_before_ms == start
    assert run.deadline_ms == start + 60_000 + GRACE
    # After the scheduled time but before the jittered start: it cannot have started.
    d = w.apply(WorkerLost("j", RUN, 1, "w1", T + 1_000))
    assert d.runs[0].state == "due"
    assert d.dispatch[0].not_before_ms == start


def test_a_state_without_the_start_time_falls_back_to_the_schedule() -> None:
    """Run states written before `not_before_ms` existed: a first attempt's start time is
    its scheduled time plus jitter; a later attempt's is unknown (assume it started)."""
    w = claimed()
    w.runs[RUN] = replace(w.runs[RUN], not_before_ms=None)
    d = w.apply(WorkerLost("j", RUN, 1, "w1", T - 1))
    assert d.runs[0].state == "due"
    assert d.dispatch[0].not_before_ms == T
    w = claimed(idempotent=True, retry=RetryPolicy(max_attempts=3))
    old: RunState = replace(w.runs[RUN], attempt=2, not_before_ms=None)
    w.runs[RUN] = old
    d = w.apply(WorkerLost("j", RUN, 2, "w1", T - 1))
    assert (d.runs[0].state, d.runs[0].attempt) == ("retrying", 2)


# -- the audit accepts these histories ------------------------------------------------------
def test_the_audit_accepts_releases_and_losses_before_the_start() -> None:
    w = claimed()
    w.apply(RunReleased("j", RUN, 1, "w1", "no room", AHEAD + 1_000))
    assert grants(w, "w1", AHEAD + 2_000) == [True]
    w.apply(WorkerLost("j", RUN, 1, "w1", T - 10_000))
    assert grants(w, "w2", T - 9_000) == [True]
    finish(w, "w2", T + 100)
    located = [(e, 0, offset) for offset, e in enumerate(w.events)]
    report = audit(located, AuditConfig(), now_ms=T + 30_000)
    assert report.clean, report.violations
    assert w.states(RUN) == [
        "due",
        "dispatched",
        "due",
        "dispatched",
        "due",
        "dispatched",
        "running",
        "succeeded",
    ]


@pytest.mark.parametrize("idempotent", [False, True])
@pytest.mark.parametrize(
    "error", ["lost: the executor failed", "fenced: the worker could not prove it was alive"]
)
def test_a_worker_reporting_an_attempt_lost_retries_only_idempotent_jobs(
    idempotent: bool, error: str
) -> None:
    """The worker's own `lost` report (its executor died mid-run) is judged like a
    WorkerLost verdict: whether the attempt did its work is unknown."""
    w = claimed(idempotent=idempotent, retry=RetryPolicy(max_attempts=3, backoff_s=1))
    w.apply(RunStarted("j", RUN, 1, "w1", T))
    w.apply(RunFinished("j", RUN, 1, "w1", None, error, T + 500))
    assert w.runs[RUN].state == ("retrying" if idempotent else "failed")
    # An ordinary failure (a non-zero exit) still retries either way.
    other = claimed(idempotent=False, retry=RetryPolicy(max_attempts=3, backoff_s=1))
    other.apply(RunStarted("j", RUN, 1, "w1", T))
    other.apply(RunFinished("j", RUN, 1, "w1", 3, "", T + 500))
    assert other.runs[RUN].state == "retrying"
