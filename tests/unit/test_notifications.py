"""What the notifier sends (streams/core/notifications.py), without I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from schemas.records import JobEvent, RunEvent
from schemas.spec import EverySchedule, JobSpec, Notify
from streams.core.notifications import (
    Lateness,
    Route,
    Watch,
    backoff_s,
    final_alert,
    final_kind,
    late_id,
    watch_after,
    watch_for,
)

HOOK = "https://hooks.example/cronlog"


def spec(**extra: object) -> JobSpec:
    return JobSpec("j", "team", EverySchedule(1000), ("true",), **extra)  # type: ignore[arg-type]


def event(state: str, at_ms: int, attempt: int = 1, reason: str = "", n: int = 0) -> RunEvent:
    return RunEvent(
        event_id=f"j@0#{n}",
        job_id="j",
        run_id="j@0",
        scheduled_ms=0,
        trigger="schedule",
        attempt=attempt,
        state=state,  # type: ignore[arg-type]
        at_ms=at_ms,
        worker_id="w",
        reason=reason,
    )


def test_a_job_and_its_owner_route_merge_by_url_and_late_needs_an_sla() -> None:
    owner = {"team": Notify(HOOK, ("lost", "late"))}
    watch = watch_for(spec(notify=Notify(HOOK, ("failed",))), owner)
    assert watch == Watch("team", (Route(HOOK, frozenset({"failed", "lost"})),), None)
    timed = watch_for(spec(notify=Notify("http://other/x", ("late",)), sla_s=2.5), owner)
    assert timed is not None
    assert timed.sla_ms == 2500
    assert {r.url: r.on for r in timed.routes} == {
        HOOK: frozenset({"lost", "late"}),
        "http://other/x": frozenset({"late"}),
    }
    assert watch_for(spec(), {}) is None
    assert watch_for(spec(), {"team": Notify(HOOK, ("late",))}) is None  # no sla_s: nothing


def test_final_states_and_their_kinds() -> None:
    assert final_kind(event("failed", 5, reason="exit code 1")) == "failed"
    assert final_kind(event("failed", 5, reason="lost: worker w1")) == "lost"
    assert final_kind(event("skipped", 5, reason="misfire")) == "skipped"
    for state in ("due", "running", "retrying", "succeeded", "cancelled"):
        assert final_kind(event(state, 5)) is None
    watch = Watch("team", (Route(HOOK, frozenset({"lost"})),), None)
    assert final_alert(event("failed", 5, reason="exit code 1"), watch) is None
    found = final_alert(event("failed", 5, reason="lost: worker w1", n=7), watch)
    assert found is not None
    alert, routes = found
    assert (alert.kind, alert.delivery_id, routes) == ("lost", "j@0#7", watch.routes)


# A run's life: (state, at) in time order; a start may never come.
lives = st.builds(
    lambda due_at, start_at, end_at, ends, starts: (
        due_at,
        start_at if starts else None,
        end_at,
        ends,
    ),
    st.integers(0, 50),
    st.integers(0, 5000),
    st.integers(0, 5000),
    st.booleans(),
    st.booleans(),
)


@given(lives, st.integers(1, 3000), st.lists(st.integers(0, 6000), max_size=6))
def test_late_exactly_when_the_first_attempt_did_not_start_within_the_sla(
    life: tuple[int, int | None, int, bool], sla_ms: int, ticks: list[int]
) -> None:
    due_at, start_at, end_at, ends = life
    events = [event("due", due_at, n=0)]
    if start_at is not None:
        start_at = max(start_at, due_at)
        events.append(event("running", start_at, n=1))
    end = max(end_at, start_at or due_at)
    if ends:
        events.append(event("succeeded" if start_at is not None else "cancelled", end, n=2))
    watch = Watch("team", (Route(HOOK, frozenset({"late"})),), sla_ms)
    late = Lateness[int]()
    alerts = []
    # The notifier reads each event once its time has come, and ticks in between.
    timeline = sorted(
        [(e.at_ms, 0, e) for e in events] + [(t, 1, None) for t in ticks],
        key=lambda x: (x[0], x[1]),
    )
    held: set[int] = set()
    for at, _, ev in timeline:
        if ev is None:
            for alert, token in late.due(at):
                alerts.append(alert)
                held.discard(token)
            continue
        seen = late.observe(ev, watch, token=at)
        if seen.held:
            held.add(at)
        if seen.freed is not None:
            held.discard(seen.freed)
        if seen.alert is not None:
            alerts.append(seen.alert)
    deadline = sla_ms  # scheduled at 0
    started_in_time = start_at is not None and start_at <= deadline
    truth = not started_in_time and (
        (start_at is not None and start_at > deadline)
        or (ends and end > deadline)
        or any(
            t >= max(deadline, due_at)
            and (start_at is None or t < start_at)
            and (not ends or t < end)
            for t in ticks
        )
    )
    assert len(alerts) <= 1
    assert bool(alerts) == truth, alerts
    assert all(a.delivery_id == late_id("j@0") and a.kind == "late" for a in alerts)
    if start_at is not None or ends or alerts:
        assert len(late) == 0
        assert not held


def test_retries_back_off_by_doubling_up_to_the_cap() -> None:
    assert [backoff_s(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_a_pause_or_resume_keeps_the_watch_an_upsert_replaces_it_a_delete_drops_it() -> None:
    """Runs decided before a pause still fail while the job is paused (and after the
    resume): their alerts must still go out."""
    before = watch_for(spec(notify=Notify(HOOK, ("failed",))), {})
    assert before is not None
    for kind in ("paused", "resumed"):
        assert watch_after(JobEvent("j#job#2", "j", kind, 5, None), before, {}) is before
    quiet = JobEvent("j#job#3", "j", "upserted", 6, spec())
    assert watch_after(quiet, before, {}) is None
    louder = JobEvent("j#job#3", "j", "upserted", 6, spec(notify=Notify(HOOK, ("lost",))))
    assert watch_after(louder, None, {}) == Watch("team", (Route(HOOK, frozenset({"lost"})),), None)
    assert watch_after(JobEvent("j#job#4", "j", "deleted", 7, None), before, {}) is None
