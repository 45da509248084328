"""The ledger's state machine, rule by rule (pure: no Kafka)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from schemas.records import (
    CancelRequested,
    ClaimReply,
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
    WorkerLost,
)
from schemas.spec import CronSchedule, EverySchedule, JobSpec, RetryPolicy
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.ledger import WITHDRAWN_BY_DELETE, WITHDRAWN_BY_PAUSE, LedgerConfig
from streams.core.schedule import fires_between, next_fire
from streams.core.seals import seal, sealed
from tests.support.world import World

T0 = 1_800_000_000_000  # a multiple of 60 s
MIN = 60_000


def spec(**changes: object) -> JobSpec:
    base = JobSpec(job_id="j", owner="o", schedule=EverySchedule(MIN), command=("true",))
    return replace(base, **changes)  # type: ignore[arg-type]


def world(**changes: object) -> World:
    w = World()
    w.apply(JobUpserted(spec(**changes), T0))
    return w


def rid(t: int) -> str:
    return scheduled_run_id("j", t)


def test_registration_schedules_the_first_fire_after_it() -> None:
    w = world()
    assert w.jobs["j"].next_due_ms == T0 + MIN
    assert w.jobs["j"].fired_ms == T0


def test_one_run_per_firing_and_duplicates_change_nothing() -> None:
    w = world()
    first = w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    assert [r.state for r in first.runs] == ["due"]
    assert [e.event_id for e in first.events] == [f"{rid(T0 + MIN)}#1"]
    assert len(first.dispatch) == 1
    for proposer in ("a", "b", "zombie"):
        again = w.apply(FireProposed("j", T0 + MIN, T0 + MIN + 5, proposer))
        assert not again.changed
        assert again.rejected == "already decided"
    assert w.jobs["j"].next_due_ms == T0 + 2 * MIN
    assert len(w.run_events()) == 1


def test_bogus_and_early_proposals_are_rejected() -> None:
    w = world()
    assert w.apply(FireProposed("j", T0 + MIN + 1, T0 + MIN, "a")).rejected.startswith("not a")
    far = T0 + 20 * MIN
    assert w.apply(FireProposed("j", far, T0, "a")).rejected == "proposed too early"
    assert w.apply(FireProposed("nope", T0, T0, "a")).rejected == "unknown job nope"


def test_pre_dispatch_proposal_within_lead_is_accepted() -> None:
    w = world()
    d = w.apply(FireProposed("j", T0 + MIN, T0 + MIN - 10_000, "a"))
    assert d.dispatch[0].not_before_ms == T0 + MIN


@pytest.mark.parametrize(
    ("policy", "runs", "skipped"),
    [
        ("run_all", 10, 0),
        ("run_once", 1, 9),
        ("skip", 0, 10),
    ],
)
def test_misfire_policy_after_a_gap(policy: str, runs: int, skipped: int) -> None:
    w = world(misfire=policy)
    w.config = LedgerConfig(misfire_grace_ms=10_000)
    late = T0 + 10 * MIN + 30_000  # ten firings missed, the newest 30 s ago
    w.apply(FireProposed("j", T0 + MIN, late, "takeover"))
    states = [e.state for e in w.run_events()]
    assert states.count("due") == runs
    assert states.count("skipped") == skipped
    # Every missed firing is decided exactly once, and the watermark moved past them.
    assert len({e.run_id for e in w.run_events()}) == 10
    assert w.jobs["j"].fired_ms == T0 + 10 * MIN
    assert w.jobs["j"].next_due_ms == T0 + 11 * MIN
    if policy == "run_once":
        assert w.states(rid(T0 + 10 * MIN)) == ["due"]


def test_a_timely_firing_runs_whatever_the_misfire_policy() -> None:
    w = world(misfire="skip")
    at = T0 + 10 * MIN + 30_000  # T0+10min is 30 s old: within the 60 s grace
    w.apply(FireProposed("j", T0 + MIN, at, "takeover"))
    assert w.states(rid(T0 + 10 * MIN)) == ["due"]
    assert [e.state for e in w.run_events()].count("skipped") == 9


def test_catch_up_window_bounds_a_long_outage() -> None:
    w = world(misfire="run_all")
    w.config = LedgerConfig(catchup_window_ms=5 * MIN)
    w.apply(FireProposed("j", T0 + MIN, T0 + 60 * MIN, "takeover"))
    created = {e.run_id for e in w.run_events()}
    assert created == {rid(T0 + k * MIN) for k in range(56, 61)}


def _claim_start(
    w: World, run_id: str, worker: str = "w1", attempt: int = 1, at: int = T0 + MIN
) -> None:
    w.apply(ClaimRequested("j", run_id, attempt, worker, at))
    w.apply(RunStarted("j", run_id, attempt, worker, at + 10))


def test_concurrency_forbid_skips_and_replace_cancels() -> None:
    w = world(concurrency="forbid")
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    _claim_start(w, rid(T0 + MIN))
    w.apply(FireProposed("j", T0 + 2 * MIN, T0 + 2 * MIN, "a"))
    assert w.states(rid(T0 + 2 * MIN)) == ["skipped"]

    w = world(concurrency="replace")
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    w.apply(FireProposed("j", T0 + 2 * MIN, T0 + 2 * MIN, "a"))
    assert w.states(rid(T0 + MIN)) == ["due", "cancelled"]
    assert w.states(rid(T0 + 2 * MIN)) == ["due"]


def test_first_claim_wins_and_stale_attempts_are_rejected() -> None:
    w = world()
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    run_id = rid(T0 + MIN)
    assert w.apply(ClaimRequested("j", run_id, 1, "w1", T0 + MIN)).runs[0].worker_id == "w1"
    second = w.apply(ClaimRequested("j", run_id, 1, "w2", T0 + MIN + 1))
    assert second.runs == ()
    assert second.job is None
    assert "already claimed by w1" in second.rejected
    assert [(r.worker_id, r.granted) for r in second.replies if isinstance(r, ClaimReply)] == [
        ("w2", False)
    ]
    again = w.apply(ClaimRequested("j", run_id, 1, "w1", T0 + MIN + 1))
    assert [(r.worker_id, r.granted) for r in again.replies if isinstance(r, ClaimReply)] == [
        ("w1", True)
    ]
    assert again.runs == ()
    assert "stale attempt" in w.apply(ClaimRequested("j", run_id, 2, "w2", T0 + MIN)).rejected
    assert not w.apply(RunStarted("j", run_id, 1, "w2", T0 + MIN + 2)).changed
    assert w.apply(RunStarted("j", run_id, 1, "w1", T0 + MIN + 2)).runs[0].state == "running"
    assert not w.apply(RunFinished("j", run_id, 1, "w2", 0, "", T0 + MIN + 3)).changed
    w.apply(RunFinished("j", run_id, 1, "w1", 0, "", T0 + MIN + 3))
    assert w.states(run_id) == ["due", "dispatched", "running", "succeeded"]
    assert not w.apply(RunFinished("j", run_id, 1, "w1", 1, "", T0 + MIN + 4)).changed
    assert w.jobs["j"].live_runs == ()


def test_a_claim_is_granted_only_with_the_seal_of_its_placement_on_that_worker() -> None:
    key = b"k" * 32
    w = world()
    w.config = LedgerConfig(placement_key=key)
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    run_id = rid(T0 + MIN)
    on_w1 = seal(key, run_id, 1, "w1")

    def answer(claim: ClaimRequested) -> list[tuple[str, bool]]:
        replies = w.apply(claim).replies
        return [(r.worker_id, r.granted) for r in replies if isinstance(r, ClaimReply)]

    # No seal, w1's seal under another worker id, a seal of another attempt or under
    # another key: refused, and the run stays due for the worker it was placed on.
    assert answer(ClaimRequested("j", run_id, 1, "w2", T0 + MIN)) == [("w2", False)]
    assert answer(ClaimRequested("j", run_id, 1, "w2", T0 + MIN, on_w1)) == [("w2", False)]
    assert (
        "was not placed on w2"
        in w.apply(ClaimRequested("j", run_id, 1, "w2", T0 + MIN, on_w1)).rejected
    )
    other_attempt = seal(key, run_id, 2, "w2")
    assert answer(ClaimRequested("j", run_id, 1, "w2", T0 + MIN, other_attempt)) == [("w2", False)]
    other_key = seal(b"x" * 32, run_id, 1, "w2")
    assert answer(ClaimRequested("j", run_id, 1, "w2", T0 + MIN, other_key)) == [("w2", False)]
    assert w.runs[run_id].state == "due"
    # The worker it was placed on, with its seal: granted; asking again needs it too.
    assert answer(ClaimRequested("j", run_id, 1, "w1", T0 + MIN + 1, on_w1)) == [("w1", True)]
    assert w.runs[run_id].worker_id == "w1"
    assert answer(ClaimRequested("j", run_id, 1, "w1", T0 + MIN + 2, on_w1)) == [("w1", True)]
    assert answer(ClaimRequested("j", run_id, 1, "w1", T0 + MIN + 2)) == [("w1", False)]
    assert w.states(run_id) == ["due", "dispatched"]


def test_a_claim_without_the_seal_cannot_settle_a_cancel_for_the_holder() -> None:
    """A cancel of a claimed attempt waits for its holder's answer; a claim naming the
    holder but without its seal (anyone can write a worker id) must not answer for it:
    the holder may be starting the job at that moment."""
    key = b"k" * 32
    w = world()
    w.config = LedgerConfig(placement_key=key)
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    run_id = rid(T0 + MIN)
    on_w1 = seal(key, run_id, 1, "w1")
    w.apply(ClaimRequested("j", run_id, 1, "w1", T0 + MIN, on_w1))
    w.apply(CancelRequested("j", run_id, T0 + MIN + 10))
    assert w.runs[run_id].cancelling
    forged = w.apply(ClaimRequested("j", run_id, 1, "w1", T0 + MIN + 20))
    assert "without its seal" in forged.rejected
    assert w.runs[run_id].state == "dispatched"
    assert w.runs[run_id].cancelling
    settled = w.apply(ClaimRequested("j", run_id, 1, "w1", T0 + MIN + 30, on_w1))
    assert [r.reason for r in settled.replies if isinstance(r, ClaimReply)] == ["cancelled"]
    assert w.runs[run_id].state == "cancelled"


def test_reports_are_taken_only_with_the_seal_of_the_placement() -> None:
    """A worker id is forgeable; the seal reaches only the worker the attempt was placed
    on: without it no worker may report another's attempt started, done or released."""
    key = b"k" * 32
    w = world()
    w.config = LedgerConfig(placement_key=key)
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    run_id = rid(T0 + MIN)
    on_w1 = seal(key, run_id, 1, "w1")
    granted = w.apply(ClaimRequested("j", run_id, 1, "w1", T0 + MIN, on_w1))
    # The grant echoes the seal (a worker that forgot the claim can still release it).
    assert [r.placement for r in granted.replies if isinstance(r, ClaimReply)] == [on_w1]
    forged = w.apply(RunReleased("j", run_id, 1, "w1", "forged", T0 + MIN + 1))
    assert not forged.changed
    assert "release of " + run_id + "#1 by w1 without its seal" in forged.rejected
    wrong = seal(key, run_id, 1, "w2")
    assert not w.apply(RunStarted("j", run_id, 1, "w1", T0 + MIN + 1, wrong)).changed
    assert w.apply(RunStarted("j", run_id, 1, "w1", T0 + MIN + 1, on_w1)).runs[0].state == (
        "running"
    )
    fake = w.apply(RunFinished("j", run_id, 1, "w1", 0, "", T0 + MIN + 2))
    assert "report of " + run_id + "#1 by w1 without its seal" in fake.rejected
    assert w.runs[run_id].state == "running"
    w.apply(RunFinished("j", run_id, 1, "w1", 0, "", T0 + MIN + 3, on_w1))
    assert w.states(run_id) == ["due", "dispatched", "running", "succeeded"]


@given(st.text(max_size=40), st.integers(1, 50), st.text(min_size=1, max_size=20))
def test_a_seal_proves_one_placement_only(run_id: str, attempt: int, worker: str) -> None:
    key = b"s" * 32
    mark = seal(key, run_id, attempt, worker)
    assert sealed(key, mark, run_id, attempt, worker)
    assert not sealed(key, mark, run_id, attempt + 1, worker)
    assert not sealed(key, mark, run_id, attempt, worker + "x")
    assert not sealed(key, mark, run_id + "x", attempt, worker)
    assert not sealed(b"t" * 32, mark, run_id, attempt, worker)
    assert not sealed(key, "", run_id, attempt, worker)


def test_failure_of_a_non_idempotent_job_is_final() -> None:
    w = world()
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    _claim_start(w, rid(T0 + MIN))
    w.apply(RunFinished("j", rid(T0 + MIN), 1, "w1", 3, "", T0 + MIN + 50))
    assert w.states(rid(T0 + MIN))[-1] == "failed"
    assert w.runs[rid(T0 + MIN)].reason == "exit code 3"


def test_retries_back_off_exponentially_then_give_up() -> None:
    w = world(
        idempotent=True,
        retry=RetryPolicy(max_attempts=3, backoff_s=10, backoff_multiplier=2, max_backoff_s=600),
    )
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    run_id = rid(T0 + MIN)
    at = T0 + MIN
    for attempt, backoff_ms in ((1, 10_000), (2, 20_000)):
        _claim_start(w, run_id, attempt=attempt, at=at)
        w.apply(RunFinished("j", run_id, attempt, "w1", 1, "", at + 100))
        run = w.runs[run_id]
        assert run.state == "retrying"
        assert run.deadline_kind == "retry"
        assert run.deadline_ms is not None
        assert backoff_ms <= run.deadline_ms - (at + 100) <= backoff_ms * 1.1
        early = w.apply(DeadlineReached("j", run_id, attempt, "retry", run.deadline_ms - 1))
        assert early.rejected == "deadline not reached yet"
        at = run.deadline_ms
        due = w.apply(DeadlineReached("j", run_id, attempt, "retry", at))
        assert due.runs[0].attempt == attempt + 1
        assert due.dispatch[0].attempt == attempt + 1
    _claim_start(w, run_id, attempt=3, at=at)
    w.apply(RunFinished("j", run_id, 3, "w1", 1, "", at + 100))
    assert w.runs[run_id].state == "failed"


@pytest.mark.parametrize(("idempotent", "state"), [(False, "failed"), (True, "retrying")])
def test_a_dead_workers_attempt_retries_only_if_idempotent(idempotent: bool, state: str) -> None:
    w = world(idempotent=idempotent, retry=RetryPolicy(max_attempts=2))
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    _claim_start(w, rid(T0 + MIN))
    assert not w.apply(WorkerLost("j", rid(T0 + MIN), 1, "w9", T0 + 2 * MIN)).changed
    w.apply(WorkerLost("j", rid(T0 + MIN), 1, "w1", T0 + 2 * MIN))
    assert w.runs[rid(T0 + MIN)].state == state
    assert "lost" in w.runs[rid(T0 + MIN)].reason


def test_unclaimed_dispatch_is_sent_again_and_timeout_backstop_fails() -> None:
    w = world(timeout_s=60)
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    run = w.runs[rid(T0 + MIN)]
    assert run.deadline_kind == "claim"
    assert run.deadline_ms is not None
    again = w.apply(DeadlineReached("j", run.run_id, 1, "claim", run.deadline_ms))
    assert len(again.dispatch) == 1
    assert again.events == ()
    _claim_start(w, run.run_id, at=T0 + 2 * MIN)
    running = w.runs[run.run_id]
    assert running.deadline_kind == "timeout"
    assert running.deadline_ms == T0 + 2 * MIN + 10 + 60_000 + LedgerConfig().timeout_grace_ms
    # The first notice asks the holder (a stop order) and waits the grace once more.
    asked = w.apply(DeadlineReached("j", run.run_id, 1, "timeout", running.deadline_ms))
    assert [(r.worker_id, r.run_id) for r in asked.replies] == [("w1", run.run_id)]
    assert asked.events == ()
    after = w.runs[run.run_id]
    assert (after.state, after.asked_ms) == ("running", running.deadline_ms)
    grace = LedgerConfig().timeout_grace_ms
    assert after.deadline_ms == running.deadline_ms + grace
    # Repeats of the notice queued with it (a broker outage) are not a second one.
    assert w.apply(DeadlineReached("j", run.run_id, 1, "timeout", running.deadline_ms + 3)).rejected
    # No answer within the grace: failed, for a silence that is now true.
    w.apply(DeadlineReached("j", run.run_id, 1, "timeout", running.deadline_ms + grace))
    assert w.runs[run.run_id].state == "failed"
    assert w.runs[run.run_id].reason.startswith("timeout: no report from the worker")


@pytest.mark.parametrize(
    ("answer", "states"),
    [
        ("succeeded", ["due", "dispatched", "running", "succeeded"]),
        ("exit 3", ["due", "dispatched", "running", "failed"]),
        ("released", ["due", "dispatched", "due"]),
        ("verdict", ["due", "dispatched", "due"]),
    ],
)
def test_the_backstop_asks_and_the_holders_late_answer_decides(
    answer: str, states: list[str]
) -> None:
    """A broker outage holds a worker's report while the backstop's notice, whose time
    ran on, reaches the ledger first: the notice asks, and the late answer decides,
    whatever it is (the run ran and succeeded or failed; it never started and runs
    again; the worker is dead: its verdict). Before, the run failed with "no report"."""
    w = world(timeout_s=5)
    start = T0 + MIN
    w.apply(FireProposed("j", start, start - 10_000, "a"))
    run_id = rid(start)
    w.apply(ClaimRequested("j", run_id, 1, "w1", start - 9_000))
    backstop = w.runs[run_id].deadline_ms
    assert backstop is not None
    w.apply(DeadlineReached("j", run_id, 1, "timeout", backstop))
    assert w.runs[run_id].asked_ms == backstop
    late = backstop + 5_000
    if answer == "succeeded":
        w.apply(RunFinished("j", run_id, 1, "w1", 0, "", late, started_ms=start))
    elif answer == "exit 3":
        w.apply(RunFinished("j", run_id, 1, "w1", 3, "", late, started_ms=start))
    elif answer == "released":
        w.apply(RunReleased("j", run_id, 1, "w1", "lease expired before the start", late))
    else:
        w.apply(WorkerLost("j", run_id, 1, "w1", late, lease_ended_ms=start - 1))
    assert w.states(run_id) == states
    assert w.runs[run_id].asked_ms is None
    assert "no report" not in w.runs[run_id].reason


def test_pause_stops_firing_and_resume_does_not_replay_the_pause() -> None:
    w = world()
    w.apply(JobPaused("j", T0 + 30_000))
    assert w.jobs["j"].next_due_ms is None
    assert w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a")).rejected
    w.apply(JobResumed("j", T0 + 5 * MIN + 30_000))
    assert w.jobs["j"].next_due_ms == T0 + 6 * MIN
    assert w.run_events() == []


def test_pause_cancels_runs_created_ahead_for_after_the_pause() -> None:
    w = world()
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN - 10_000, "a"))  # pre-dispatched
    w.apply(ClaimRequested("j", rid(T0 + MIN), 1, "w1", T0 + MIN - 9_000))
    decision = w.apply(JobPaused("j", T0 + MIN - 5_000))
    assert [r.worker_id for r in decision.replies] == ["w1"]  # told to drop it
    # Cancelled when the holder answers: it releases the attempt.
    assert w.runs[rid(T0 + MIN)].cancelling == WITHDRAWN_BY_PAUSE
    assert w.states(rid(T0 + MIN)) == ["due", "dispatched"]
    w.apply(release_by_w1(T0 + MIN - 4_990))
    assert w.states(rid(T0 + MIN)) == ["due", "dispatched", "cancelled"]
    assert w.runs[rid(T0 + MIN)].reason == WITHDRAWN_BY_PAUSE


def test_delete_cancels_waiting_runs_and_stops_the_job() -> None:
    w = world()
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    w.apply(JobDeleted("j", T0 + MIN + 5))
    assert w.states(rid(T0 + MIN)) == ["due", "cancelled"]
    assert w.jobs["j"].deleted
    assert w.apply(FireProposed("j", T0 + 2 * MIN, T0 + 2 * MIN, "a")).rejected


def test_delete_cancels_runs_claimed_ahead_of_their_time() -> None:
    w = world()
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN - 40_000, "a"))  # looked ahead
    w.apply(ClaimRequested("j", rid(T0 + MIN), 1, "w1", T0 + MIN - 39_000))
    decision = w.apply(JobDeleted("j", T0 + MIN - 30_000))
    assert [r.worker_id for r in decision.replies] == ["w1"]  # told to drop it
    assert w.runs[rid(T0 + MIN)].cancelling == WITHDRAWN_BY_DELETE
    w.apply(release_by_w1(T0 + MIN - 29_990))
    assert w.states(rid(T0 + MIN)) == ["due", "dispatched", "cancelled"]
    assert w.runs[rid(T0 + MIN)].reason == WITHDRAWN_BY_DELETE


def release_by_w1(at: int) -> RunReleased:
    """w1 releases run T0+MIN, as a worker does on a stop order before the start."""
    return RunReleased("j", rid(T0 + MIN), 1, "w1", "cancelled before the start", at)


def paused_while_claimed() -> World:
    """Run T0+MIN claimed by w1 45 s ahead, then the job paused: a cancel is pending."""
    w = world()
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN - 45_000, "a"))
    w.apply(ClaimRequested("j", rid(T0 + MIN), 1, "w1", T0 + MIN - 44_000))
    w.apply(JobPaused("j", T0 + MIN - 30_000))
    assert w.runs[rid(T0 + MIN)].cancelling == WITHDRAWN_BY_PAUSE
    return w


def test_a_start_that_raced_the_stop_order_is_recorded_then_cancelled() -> None:
    w = paused_while_claimed()
    decision = w.apply(RunStarted("j", rid(T0 + MIN), 1, "w1", T0 + MIN))
    assert w.states(rid(T0 + MIN)) == ["due", "dispatched", "running", "cancelled"]
    assert w.runs[rid(T0 + MIN)].reason == f"{WITHDRAWN_BY_PAUSE} (it had started)"
    assert [type(r).__name__ for r in decision.replies] == ["CancelOrder"]  # again
    # It ran: a resume does not revive it (one run per firing).
    w.apply(JobResumed("j", T0 + MIN + 1_000))
    assert not w.apply(FireProposed("j", T0 + MIN, T0 + MIN + 2_000, "a")).runs


@pytest.mark.parametrize(
    "answer",
    [
        RunFinished("j", rid(T0 + MIN), 1, "w1", 0, "", T0 + MIN + 500),
        RunFinished("j", rid(T0 + MIN), 1, "w1", 3, "", T0 + MIN + 500),
        RunFinished("j", rid(T0 + MIN), 1, "w1", None, "cancelled", T0 + MIN + 500),
        WorkerLost("j", rid(T0 + MIN), 1, "w1", T0 + MIN + 20_000),
    ],
)
def test_an_outcome_settles_a_pending_cancel_without_a_retry(answer: object) -> None:
    w = paused_while_claimed()
    w.apply(answer)  # type: ignore[arg-type]
    run = w.runs[rid(T0 + MIN)]
    if isinstance(answer, RunFinished) and answer.exit_code == 0:
        assert run.state == "succeeded"  # it ran to its end before the order came
    else:
        assert run.state == "cancelled"
        assert run.reason.startswith(WITHDRAWN_BY_PAUSE + " (it ")  # never revived
    assert run.attempt == 1


def test_a_verdict_before_the_start_time_settles_it_as_withdrawn() -> None:
    w = paused_while_claimed()
    w.apply(WorkerLost("j", rid(T0 + MIN), 1, "w1", T0 + MIN - 20_000))
    assert (w.runs[rid(T0 + MIN)].state, w.runs[rid(T0 + MIN)].reason) == (
        "cancelled",
        WITHDRAWN_BY_PAUSE,
    )


def test_the_holder_asking_again_settles_it_and_is_refused() -> None:
    w = paused_while_claimed()
    replies = w.apply(ClaimRequested("j", rid(T0 + MIN), 1, "w1", T0 + MIN - 29_000)).replies
    assert [(r.granted, r.reason) for r in replies if isinstance(r, ClaimReply)] == [
        (False, "cancelled")
    ]
    assert w.runs[rid(T0 + MIN)].state == "cancelled"


def test_a_resume_before_the_answer_keeps_the_run() -> None:
    w = paused_while_claimed()
    w.apply(JobResumed("j", T0 + MIN - 20_000))
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN - 15_000, "a"))
    run = w.runs[rid(T0 + MIN)]
    assert (run.state, run.attempt, run.cancelling) == ("dispatched", 1, "")
    # The stop order still reaches the worker, which releases the attempt: dispatched
    # again, as any attempt released.
    w.apply(release_by_w1(T0 + MIN - 14_000))
    assert (w.runs[rid(T0 + MIN)].state, w.runs[rid(T0 + MIN)].attempt) == ("due", 1)


def test_a_cancel_by_request_overrides_a_pending_withdrawal() -> None:
    w = paused_while_claimed()
    assert not w.apply(CancelRequested("j", rid(T0 + MIN), T0 + MIN - 25_000)).replies
    assert w.runs[rid(T0 + MIN)].cancelling == "cancelled by request"
    w.apply(JobResumed("j", T0 + MIN - 20_000))
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN - 15_000, "a"))
    assert w.runs[rid(T0 + MIN)].cancelling == "cancelled by request"  # not undone


def test_run_now_and_rerun_are_idempotent_on_request_id() -> None:
    w = world()
    first = w.apply(RunNowRequested("j", "req-1", T0 + 5))
    assert [r.run_id for r in first.runs] == [manual_run_id("j", "req-1")]
    assert w.apply(RunNowRequested("j", "req-1", T0 + 6)).rejected == "duplicate request"
    run_id = manual_run_id("j", "req-1")
    _claim_start(w, run_id, at=T0 + 10)
    w.apply(RunFinished("j", run_id, 1, "w1", 1, "", T0 + 20))
    rerun = w.apply(RerunRequested("j", run_id, "again-1", T0 + 30))
    assert rerun.runs[0].attempt == 2
    assert rerun.runs[0].state == "due"
    assert w.apply(RerunRequested("j", run_id, "again-1", T0 + 31)).rejected
    assert "still due" in w.apply(RerunRequested("j", run_id, "again-2", T0 + 32)).rejected


def test_cancel_is_final_and_late_reports_are_ignored() -> None:
    w = world()
    w.apply(FireProposed("j", T0 + MIN, T0 + MIN, "a"))
    _claim_start(w, rid(T0 + MIN))
    w.apply(CancelRequested("j", rid(T0 + MIN), T0 + MIN + 20))
    assert w.runs[rid(T0 + MIN)].state == "cancelled"
    assert not w.apply(RunFinished("j", rid(T0 + MIN), 1, "w1", 0, "", T0 + MIN + 30)).changed


def test_only_the_newest_final_runs_are_kept() -> None:
    w = world()
    w.config = LedgerConfig(keep_final_runs=3)
    for k in range(1, 8):
        t = T0 + k * MIN
        w.apply(FireProposed("j", t, t, "a"))
        _claim_start(w, rid(t), at=t)
        w.apply(RunFinished("j", rid(t), 1, "w1", 0, "", t + 100))
    assert set(w.runs) == {rid(T0 + k * MIN) for k in (5, 6, 7)}
    # Forgotten runs stay decided: the watermark still rejects their proposals.
    assert w.apply(FireProposed("j", T0 + MIN, T0 + 8 * MIN, "a")).rejected == "already decided"


_CRON_ZONES = ("Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC")
_CRON_EXPRS = ("*/20 * * * *", "30 1-3 * * *", "0 2 * * *", "15,45 * * * *")


@settings(max_examples=150, deadline=None)
@given(
    zone=st.sampled_from(_CRON_ZONES),
    expr=st.sampled_from(_CRON_EXPRS),
    start_day=st.sampled_from(
        # A few days before spring-forward / fall-back in these zones, and a quiet week.
        (
            datetime(2026, 3, 27, tzinfo=UTC),
            datetime(2026, 10, 23, tzinfo=UTC),
            datetime(2026, 3, 6, tzinfo=UTC),
            datetime(2026, 4, 3, tzinfo=UTC),
            datetime(2026, 6, 10, tzinfo=UTC),
        )
    ),
    plan=st.lists(st.sampled_from(("on_time", "late", "missing")), min_size=5, max_size=60),
)
def test_cron_firings_are_each_decided_once_whatever_proposals_arrive(
    zone: str, expr: str, start_day: datetime, plan: list[str]
) -> None:
    """The ledger's firing rule against the schedule maths, for cron jobs across DST
    changes: proposals on time, late or missing, every fire time is decided once, and
    with run_all every one of them runs."""
    registered = int(start_day.timestamp() * 1000)
    w = World()
    w.config = LedgerConfig(catchup_window_ms=30 * 86_400_000, max_catchup_runs=100_000)
    job = spec(schedule=CronSchedule(expr, zone), misfire="run_all")
    w.apply(JobUpserted(job, registered))
    times = fires_between(job.schedule, registered, registered + 6 * 86_400_000, limit=len(plan))
    assume(times)
    plan = plan[: len(times)]
    plan[-1] = "on_time"
    for t, how in zip(times, plan, strict=True):
        if how == "on_time":
            w.apply(FireProposed("j", t, t - 500, "node"))
        elif how == "late":
            w.apply(FireProposed("j", t, t + 90_000, "node"))
    decided = [e.scheduled_ms for e in w.run_events() if e.state in ("due", "skipped")]
    assert sorted(decided) == times
    assert {e.state for e in w.run_events()} <= {"due", "dispatched"}
    assert w.jobs["j"].fired_ms == times[-1]
    assert w.jobs["j"].next_due_ms == next_fire(job.schedule, times[-1])


def test_a_job_id_stays_with_its_owner_even_after_a_delete() -> None:
    """The ledger checks ownership where it decides: an upsert by another owner changes
    nothing (and goes to the DLQ), whatever the API's projection showed at the time."""
    w = world()
    taken = w.apply(JobUpserted(spec(owner="mallory", command=("steal",)), T0 + 1_000))
    assert taken.dead_letter
    assert "belongs to owner 'o'" in taken.rejected
    assert taken.job is None
    assert not taken.events
    assert w.jobs["j"].spec.owner == "o"
    assert w.jobs["j"].spec.command == ("true",)
    w.apply(JobDeleted("j", T0 + 2_000))
    again = w.apply(JobUpserted(spec(owner="mallory"), T0 + 3_000))
    assert again.dead_letter
    assert w.jobs["j"].deleted
    assert w.jobs["j"].spec.owner == "o"
    # The owner itself may change and re-create it.
    back = w.apply(JobUpserted(spec(command=("false",)), T0 + 4_000))
    assert not back.rejected
    assert not w.jobs["j"].deleted
    assert w.jobs["j"].spec.command == ("false",)


def test_a_placeholder_upstream_belongs_to_no_one_until_registered() -> None:
    w = World()
    w.apply(JobUpserted(spec(job_id="down", schedule=None, depends_on=("up",)), T0))
    assert w.jobs["up"].version == 0  # the link made a placeholder, owned by no one
    first = w.apply(JobUpserted(spec(job_id="up", owner="team-up"), T0 + 1_000))
    assert not first.rejected
    assert w.jobs["up"].spec.owner == "team-up"


def test_the_history_keeps_when_the_worker_started_and_finished() -> None:
    # A burst's reports can reach the ledger seconds after the starts they tell of: the
    # run's start and finish are the worker's stamps, its events' at_ms the records.
    w = world()
    t = T0 + MIN
    w.apply(FireProposed("j", t, t - 20_000, "a"))
    w.apply(ClaimRequested("j", rid(t), 1, "w1", t - 15_000))
    w.apply(RunStarted("j", rid(t), 1, "w1", t + 300), now=t + 12_000)
    started = w.run_events(rid(t))[-1]
    assert (started.state, started.at_ms, started.reported_ms) == ("running", t + 12_000, t + 300)
    assert started.happened_ms == w.runs[rid(t)].started_ms == t + 300
    w.apply(RunFinished("j", rid(t), 1, "w1", 0, "", t + 900), now=t + 13_000)
    assert w.runs[rid(t)].finished_ms == t + 900
    assert w.run_events(rid(t))[-1].happened_ms == t + 900
    # The ledger's own transitions carry no report.
    assert [e.reported_ms for e in w.run_events(rid(t))[:2]] == [None, None]


@given(
    grant=st.integers(-30_000, 5_000),
    stamp=st.integers(-120_000, 120_000),
    lag=st.integers(0, 60_000),
    end=st.integers(-120_000, 120_000),
    exit_code=st.sampled_from([0, 1]),
)
def test_a_reported_time_stays_within_what_the_ledger_can_vouch_for(
    grant: int, stamp: int, lag: int, end: int, exit_code: int
) -> None:
    # Whatever a worker's clock says: no start before its grant and its start time, no
    # finish before its start, nothing after the ledger recorded it.
    w = world()
    t = T0 + MIN
    w.apply(FireProposed("j", t, t - 40_000, "a"))
    w.apply(ClaimRequested("j", rid(t), 1, "w1", t + grant))
    granted = w.runs[rid(t)].updated_ms
    recorded = max(t, granted) + lag
    w.apply(RunStarted("j", rid(t), 1, "w1", t + stamp), now=recorded)
    start = w.runs[rid(t)].started_ms
    assert start is not None
    assert max(t, granted) <= start <= recorded
    assert start == min(max(t + stamp, max(t, granted)), recorded)
    w.apply(RunFinished("j", rid(t), 1, "w1", exit_code, "", t + end), now=recorded + lag)
    last = w.run_events(rid(t))[-1]
    assert last.reported_ms is not None
    assert start <= last.reported_ms <= recorded + lag


@given(
    grant=st.integers(-30_000, 5_000),
    stamp=st.integers(-60_000, 60_000),
    took=st.integers(0, 200),
    lag=st.integers(0, 10_000),
    exit_code=st.sampled_from([0, 1, None]),
    error=st.sampled_from(["", "killed", "lost: the executor failed", "fenced"]),
    reporter=st.sampled_from(["w1", "w2"]),
    paused=st.booleans(),
    idempotent=st.booleans(),
)
def test_a_finish_that_carries_its_start_decides_as_the_two_reports_would(
    grant: int,
    stamp: int,
    took: int,
    lag: int,
    exit_code: int | None,
    error: str,
    reporter: str,
    paused: bool,
    idempotent: bool,
) -> None:
    # A short run's worker sends one report (RunFinished.started_ms) instead of a
    # RunStarted and a RunFinished: the run and its history must come out the same.
    w = world(idempotent=idempotent, retry=RetryPolicy(max_attempts=2))
    t = T0 + MIN
    w.apply(FireProposed("j", t, t - 40_000, "a"))
    w.apply(ClaimRequested("j", rid(t), 1, "w1", t + grant))
    if paused:  # a stop order on its way: the start is recorded, then cancelled
        w.apply(JobPaused("j", t + grant + 1))
    recorded = max(t, w.runs[rid(t)].updated_ms) + lag
    start, end = t + stamp, t + stamp + took
    apart, together = w.snapshot(), w.snapshot()
    apart.apply(RunStarted("j", rid(t), 1, reporter, start), now=recorded)
    apart.apply(RunFinished("j", rid(t), 1, reporter, exit_code, error, end), now=recorded)
    together.apply(
        RunFinished("j", rid(t), 1, reporter, exit_code, error, end, started_ms=start),
        now=recorded,
    )
    assert together.runs == apart.runs
    assert together.run_events() == apart.run_events()
    assert together.dispatch == apart.dispatch
    assert together.replies == apart.replies
    # The second report of the two, after a refused start or a start that settled a
    # cancel, is refused too: one refusal fewer, never a different one.
    assert together.rejections == apart.rejections[: len(together.rejections)]
    assert len(apart.rejections) - len(together.rejections) in (0, 1)
    if reporter == "w1" and not paused:
        assert "running" in together.states(rid(t))
