"""The acceptance checks of the fault tests and the chaos benchmark, read from run-events.

For jobs `every N s` registered, then paused: every firing between registration and
pause has exactly one run (no duplicate, none missed), every run is final, and each
acknowledged manual request has its run. Start lateness around a fault is measured from
the runs' own events (the start the history shows, the worker's report within what the
ledger vouches for, against the scheduled time).
"""

from __future__ import annotations

import io
import time
from collections import defaultdict
from dataclasses import dataclass, field

from connectors.audit.checker import format_report
from connectors.audit.replay import replay
from schemas.records import RunEvent
from schemas.spec import EverySchedule
from streams.core.percentile import nearest_rank_sorted
from streams.core.schedule import fires_between
from streams.settings import Settings
from tests.support.nodes import EventReader, runs_by_id, send_commands

FINALS = ("succeeded", "failed", "cancelled", "skipped")


@dataclass
class Verdict:
    firings_checked: int = 0
    duplicates: list[tuple[str, int]] = field(default_factory=list)
    missed: list[tuple[str, int]] = field(default_factory=list)
    not_final: list[str] = field(default_factory=list)
    not_succeeded: dict[str, str] = field(default_factory=dict)  # run id -> final state
    lost_commands: list[str] = field(default_factory=list)

    @property
    def violations(self) -> int:
        return (
            len(self.duplicates)
            + len(self.missed)
            + len(self.not_final)
            + len(self.not_succeeded)
            + len(self.lost_commands)
        )

    def summary(self) -> dict[str, object]:
        return {
            "firings_checked": self.firings_checked,
            "duplicates": len(self.duplicates),
            "missed": len(self.missed),
            "not_final": len(self.not_final),
            "not_succeeded": len(self.not_succeeded),
            "lost_commands": len(self.lost_commands),
            "examples": {
                "duplicates": self.duplicates[:3],
                "missed": self.missed[:3],
                "not_final": self.not_final[:3],
                "not_succeeded": list(self.not_succeeded.items())[:3],
                "lost_commands": self.lost_commands[:3],
            },
        }


def check_firings(
    events: EventReader,
    jobs: list[str],
    every_ms: int,
    manual_runs: list[str] = (),  # type: ignore[assignment]
    require_success: bool = True,
) -> Verdict:
    """Check the periodic jobs `jobs` (registered, then paused) and the manual runs."""
    verdict = Verdict()
    registered: dict[str, int] = {}
    paused: dict[str, int] = {}
    for e in events.job_events():
        if e.kind == "upserted":
            registered[e.job_id] = min(e.at_ms, registered.get(e.job_id, e.at_ms))
        elif e.kind == "paused":
            paused.setdefault(e.job_id, e.at_ms)
    verdict.lost_commands += [f"upsert {j}" for j in jobs if j not in registered]
    verdict.lost_commands += [f"pause {j}" for j in jobs if j not in paused]
    runs = runs_by_id(events)
    by_time: defaultdict[tuple[str, int], set[str]] = defaultdict(set)
    for run_id, evs in runs.items():
        if evs[0].trigger != "manual":
            by_time[(evs[0].job_id, evs[0].scheduled_ms)].add(run_id)
        if evs[-1].state not in FINALS:
            verdict.not_final.append(f"{run_id}: {evs[-1].state}")
    verdict.duplicates = sorted(k for k, ids in by_time.items() if len(ids) > 1)
    schedule = EverySchedule(every_ms)
    for job_id in jobs:
        if job_id not in registered or job_id not in paused:
            continue
        for t in fires_between(schedule, registered[job_id], paused[job_id]):
            verdict.firings_checked += 1
            ids = by_time.get((job_id, t))
            if not ids:
                verdict.missed.append((job_id, t))
                continue
            for run_id in ids:
                final = runs[run_id][-1].state
                if require_success and final in FINALS and final != "succeeded":
                    verdict.not_succeeded[run_id] = f"{final}: {runs[run_id][-1].reason}"
    verdict.lost_commands += [f"run-now {r}" for r in manual_runs if r not in runs]
    return verdict


def pause_and_settle(settings: Settings, events: EventReader, jobs: list[str]) -> None:
    """Pause the jobs (acknowledged by the broker), then wait until every run is final."""
    send_commands(settings, [{"type": "job.pause", "job_id": j} for j in jobs])
    events.wait_until(
        lambda: {e.job_id for e in events.job_events() if e.kind == "paused"} >= set(jobs),
        120,
        "every job paused",
    )
    events.wait_until(lambda: settled(events), 180, "every run final")
    events.settle()  # and nothing more to come: every input decided, every event read


def settled(events: EventReader) -> bool:
    """Every run seen so far is in a final state."""
    runs = runs_by_id(events)
    return bool(runs) and all(evs[-1].state in FINALS for evs in runs.values())


@dataclass(frozen=True)
class Lateness:
    runs: int
    not_started: int
    p50_s: float
    p99_s: float
    max_s: float

    def __str__(self) -> str:
        return (
            f"{self.runs} runs ({self.not_started} never started), "
            f"start lateness p50 {self.p50_s:.2f} s, "
            f"p99 {self.p99_s:.2f} s, max {self.max_s:.2f} s"
        )


def _starts(
    events: EventReader, from_ms: int, to_ms: int, any_attempt: bool = False
) -> tuple[dict[str, float], int]:
    """(run id -> start lateness in s, how many never started) of the scheduled runs'
    first attempts due in [from_ms, to_ms) (`any_attempt`: the first start of any of
    the run's attempts, a retry's if the first attempt never ran)."""
    first: dict[str, RunEvent] = {}
    started: dict[str, int] = {}
    for event, _ in events.run_events():
        if event.trigger == "manual" or not from_ms <= event.scheduled_ms < to_ms:
            continue
        first.setdefault(event.run_id, event)
        if event.state == "running" and (any_attempt or event.attempt == 1):
            # When it started, as its history shows it (the worker's report, within what
            # the ledger vouches for), not when the ledger recorded it: a broker's
            # failover delays the record by seconds, not the start.
            started.setdefault(event.run_id, event.happened_ms)
    late = {
        run_id: (started[run_id] - e.scheduled_ms) / 1000
        for run_id, e in first.items()
        if run_id in started
    }
    return late, len(first) - len(late)


def latest_starts(
    events: EventReader, from_ms: int, to_ms: int, count: int = 5
) -> list[tuple[float, str]]:
    """The `count` latest starts (lateness in s, run id) among runs due in the window:
    which runs a p99 is made of."""
    late, _ = _starts(events, from_ms, to_ms)
    return sorted(((s, r) for r, s in late.items()), reverse=True)[:count]


def timeline(events: EventReader, run_id: str) -> list[str]:
    """A run's events, each as state@seconds after its scheduled time (when the ledger
    wrote it; the worker's time of the fact in brackets where it differs): where a late
    run's seconds went."""
    out = []
    for event, written_ms in events.run_events():
        if event.run_id == run_id:
            at = f"{event.state}@{(written_ms - event.scheduled_ms) / 1000:+.2f}"
            if event.happened_ms and abs(event.happened_ms - written_ms) > 50:
                at += f"({(event.happened_ms - event.scheduled_ms) / 1000:+.2f})"
            out.append(at)
    return out


def start_lateness(
    events: EventReader, from_ms: int, to_ms: int, any_attempt: bool = False
) -> Lateness:
    """Start lateness of the scheduled runs' first attempts due in [from_ms, to_ms):
    the recorded start (`happened_ms`) minus the scheduled time (`any_attempt`: of the
    run's first start, a retry's when its first attempt never ran). Runs that never
    started are counted apart (the checks say why)."""
    by_run, missing = _starts(events, from_ms, to_ms, any_attempt)
    late = sorted(by_run.values())
    if not late:
        return Lateness(0, missing, float("nan"), float("nan"), float("nan"))
    return Lateness(
        len(late),
        missing,
        nearest_rank_sorted(late, 0.5),
        nearest_rank_sorted(late, 0.99),
        late[-1],
    )


def assert_audit_clean(settings: Settings) -> None:
    """The audit of the whole log, with "now" well after the scenario (every firing up to
    it is checked, none is in flight), finds firings and no violation."""
    report, _ = replay(settings, now_ms=int(time.time() * 1000) + 5 * 60_000)
    assert report.expected_firings > 0
    text = io.StringIO()
    format_report(report, text)
    assert report.clean, text.getvalue()


def first_start_after(events: EventReader, since_ms: int) -> int | None:
    """When (Kafka timestamp, ms) the first run started at or after `since_ms`, if one has."""
    found = [w for e, w in events.run_events() if e.state == "running" and w >= since_ms]
    return min(found) if found else None
