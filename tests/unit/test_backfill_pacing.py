"""Backfill pacing (issue 53 item 12, owner fairness): a job holds at most
`backfill_live_runs` live backfill runs; the rest of a backfill's range waits in the
job's state (`JobState.backfill_queue`) and goes on as its earlier runs finish, driven by
the run-finished inputs on the job's own log. So one owner's big backfill never puts a
large backlog of its runs before another owner's firings, in the ledger's transactions
or on the dispatch topic. Each test fails on the ledger that created a backfill's runs
1,000 a transaction."""

from __future__ import annotations

from dataclasses import replace

from schemas.codec import JOB_STATE
from schemas.records import (
    BackfillRequested,
    FireProposed,
    JobDeleted,
    PendingBackfill,
    RunNowRequested,
)
from schemas.spec import Param
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.ledger import LedgerConfig
from tests.support.world import World
from tests.unit.test_ledger_edges import MIN, T0, S, registered, run_to_end, spec

CAP = 100


def _live_backfill(w: World, job_id: str = "j") -> list[str]:
    return [
        r
        for r in w.jobs[job_id].live_runs
        if w.runs[r].trigger == "backfill" and not w.runs[r].final
    ]


def _due_backfill_times(w: World, job_id: str = "j") -> list[int]:
    return sorted(
        e.scheduled_ms
        for e in w.run_events()
        if e.state == "due"
        and e.job_id == job_id
        and e.run_id in w.runs
        and w.runs[e.run_id].trigger == "backfill"
    )


def _finish_all_live(w: World, at: int, job_id: str = "j") -> int:
    live = _live_backfill(w, job_id)
    for n, run_id in enumerate(live):
        run_to_end(w, job_id, run_id, at + n)
        assert len(_live_backfill(w, job_id)) <= CAP
    return len(live)


def test_a_big_backfill_creates_no_more_runs_than_the_live_cap_at_once() -> None:
    w = registered(spec(), config=LedgerConfig(backfill_live_runs=CAP, keep_final_runs=5))
    start = T0 - 999 * MIN
    decision = w.apply(BackfillRequested("j", start, T0, T0 + 1, "big"))
    assert len(decision.dispatch) == CAP  # not 1,000 in one transaction
    assert not decision.notices  # no continuation: the rest waits in the job's state
    assert len(_live_backfill(w)) == CAP
    (pending,) = w.jobs["j"].backfill_queue
    assert pending.request_id == "big"
    assert pending.created == CAP
    assert pending.from_ms == start + (CAP - 1) * MIN + 1  # after the last time looked at


def test_the_rest_is_created_as_earlier_runs_finish_every_time_once() -> None:
    w = registered(spec(), config=LedgerConfig(backfill_live_runs=CAP, keep_final_runs=5))
    start = T0 - 999 * MIN
    w.apply(BackfillRequested("j", start, T0, T0 + 1, "big"))
    most = 0
    at = T0 + S
    while w.jobs["j"].backfill_queue or _live_backfill(w):
        live = _live_backfill(w)
        most = max(most, len(live))
        run_to_end(w, "j", live[0], at)  # one finish makes room for one more
        at += 1
    assert most == CAP
    times = [e.scheduled_ms for e in w.run_events() if e.state == "due"]
    assert sorted(times) == list(range(start, T0 + 1, MIN))  # 1,000 runs, each once
    assert w.jobs["j"].backfilled[-1].until_ms == T0
    # sent again: each time decided already
    w.apply(BackfillRequested("j", start, T0, at, "again"))
    assert w.rejections[-1].startswith("nothing to backfill")


def test_another_owners_firing_is_decided_alone_between_the_backfill_slices() -> None:
    """Every decision the backfill causes makes at most `backfill_live_runs` runs, and
    the quiet job's firing and run-now, arriving while the backfill is pending, are
    decided with their own runs at once."""
    quiet = replace(spec("q", every=2 * S), owner="quiet")
    w = registered(spec(), quiet, config=LedgerConfig(backfill_live_runs=CAP, keep_final_runs=5))
    w.apply(BackfillRequested("j", T0 - 5000 * MIN, T0, T0 + 1, "huge"))
    assert len(w.dispatch) == CAP
    fired = w.apply(FireProposed("q", T0 + 2 * S, T0 + 2 * S, "n"))
    assert [d.run_id for d in fired.dispatch] == [scheduled_run_id("q", T0 + 2 * S)]
    now = w.apply(RunNowRequested("q", "r1", T0 + 3 * S))
    assert [d.run_id for d in now.dispatch] == [manual_run_id("q", "r1")]
    for round_ in range(3):
        before = len(w.dispatch)
        done = _finish_all_live(w, T0 + (10 + round_) * S)
        assert done == CAP
        assert len(w.dispatch) - before == CAP  # refilled, never beyond the cap
    assert w.jobs["j"].backfill_queue[0].created == 4 * CAP


def test_backfills_queue_in_order_and_one_past_the_pending_quota_is_dead_lettered() -> None:
    config = LedgerConfig(backfill_live_runs=CAP, max_pending_backfills=3, keep_final_runs=5)
    w = registered(spec(), config=config)
    for n in range(3):
        lo = T0 - (n + 1) * 200 * MIN + MIN
        w.apply(BackfillRequested("j", lo, lo + 199 * MIN, T0 + n, f"b{n}"))
    assert [b.request_id for b in w.jobs["j"].backfill_queue] == ["b0", "b1", "b2"]
    decision = w.apply(BackfillRequested("j", T0 - 900 * MIN, T0 - 800 * MIN, T0 + 9, "b3"))
    assert decision.dead_letter
    assert "quota max_pending_backfills" in decision.rejected
    # not remembered: sent again once the queue drained, it is applied
    at = T0 + S
    while w.jobs["j"].backfill_queue or _live_backfill(w):
        at += _finish_all_live(w, at)
    assert [b.request_id for b in w.jobs["j"].backfill_queue] == []
    again = w.apply(BackfillRequested("j", T0 - 900 * MIN, T0 - 800 * MIN, T0 + 10, "b3"))
    assert not again.rejected
    assert len(again.dispatch) == CAP
    order = [e.scheduled_ms for e in w.run_events() if e.state == "due"]
    # b0's times first, then b1's, then b2's (oldest backfill first)
    firsts = [order.index(T0 - (n + 1) * 200 * MIN + MIN) for n in range(3)]
    assert firsts == sorted(firsts)


def test_a_continuation_written_before_pacing_joins_the_queue() -> None:
    """A log written by the ledger before pacing holds `<id>+<runs so far>`: it is the
    rest of an accepted backfill, paced like any other."""
    w = registered(spec(), config=LedgerConfig(backfill_live_runs=CAP, keep_final_runs=5))
    start = T0 - 499 * MIN
    d = w.apply(BackfillRequested("j", start, T0, T0 + 1, "old+1000"))
    assert not d.rejected
    assert len(d.dispatch) == CAP
    (pending,) = w.jobs["j"].backfill_queue
    assert pending.request_id == "old"
    assert pending.created == 1000 + CAP


def test_a_delete_drops_the_queued_backfills() -> None:
    w = registered(spec(), config=LedgerConfig(backfill_live_runs=CAP, keep_final_runs=5))
    w.apply(BackfillRequested("j", T0 - 999 * MIN, T0, T0 + 1, "big"))
    assert w.jobs["j"].backfill_queue
    w.apply(JobDeleted("j", T0 + 2))
    assert w.jobs["j"].backfill_queue == ()
    assert not _live_backfill(w)


def test_the_queue_survives_the_jobs_topic_codec() -> None:
    with_param = spec(params=(Param("k", "string", "x"),))
    w = registered(with_param, config=LedgerConfig(backfill_live_runs=CAP, keep_final_runs=5))
    w.apply(BackfillRequested("j", T0 - 999 * MIN, T0, T0 + 1, "big", (("k", '"v"'),)))
    state = w.jobs["j"]
    assert JOB_STATE.decode(JOB_STATE.encode(state)) == state
    back = JOB_STATE.decode(JOB_STATE.encode(state))
    assert back.backfill_queue == state.backfill_queue
    assert back.backfill_queue == (
        PendingBackfill("big", T0 - 900 * MIN + 1, T0, T0 + 1, CAP, (("k", '"v"'),)),
    )


def test_a_run_now_flood_on_the_topic_is_held_at_the_jobs_live_manual_runs() -> None:
    """Past the API, a run-now flood meets the ledger's own bound: one more run-now while
    the job holds `max_live_manual_runs` is dead-lettered naming the quota, and not
    remembered (sent again once some ended, it runs)."""
    w = registered(spec(), config=LedgerConfig(max_live_manual_runs=3))
    for n in range(3):
        assert not w.apply(RunNowRequested("j", f"r{n}", T0 + n)).rejected
    refused = w.apply(RunNowRequested("j", "r3", T0 + 5))
    assert refused.dead_letter
    assert "quota max_live_manual_runs: job j has 3" in refused.rejected
    run_to_end(w, "j", manual_run_id("j", "r0"), T0 + 6)
    again = w.apply(RunNowRequested("j", "r3", T0 + 7))
    assert not again.rejected
    assert [d.run_id for d in again.dispatch] == [manual_run_id("j", "r3")]
