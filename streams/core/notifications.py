"""What `cronlog notifier` tells a webhook, decided without I/O.

A run's events become alerts: `failed` (final, retries spent), `lost` (final after its
worker vanished: the reason the ledger writes starts with "lost"), `skipped` (a misfire or
concurrency policy) and `late` (its first attempt not running within the job's `sla_s` of
its time). Every alert has a delivery id that is the same however often the notifier
reads the event again (after a crash, a rebalance): the run event's id for the final
states, ``<run_id>:late`` for lateness. Receivers dedupe by it; the notifier delivers at
least once.

Lateness is decided by the events when they say it (a `running` event later than the
deadline, or a final state after it with no start seen: late; a start or a final state
before it: not late) and otherwise by the notifier's clock reaching the deadline with no
start seen. The clock decides only
whether to send a notification, never anything about the run.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from schemas.records import FINAL_STATES, JobEvent, RunEvent
from schemas.spec import JobSpec, Notify, NotifyOn

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Route:
    """Where alerts of some kinds go."""

    url: str
    on: frozenset[NotifyOn]


@dataclass(frozen=True, slots=True)
class Watch:
    """What the notifier must know of one job: its owner, where its alerts go, its SLA."""

    owner: str
    routes: tuple[Route, ...]
    sla_ms: int | None


@dataclass(frozen=True, slots=True)
class Alert:
    delivery_id: str
    kind: NotifyOn
    job_id: str
    owner: str
    run_id: str
    scheduled_ms: int
    attempt: int
    state: str
    reason: str
    at_ms: int  # when it happened: the event's time, or the deadline that passed
    exit_code: int | None = None


def watch_for(spec: JobSpec, owner_routes: dict[str, Notify]) -> Watch | None:
    """The job's routes: its own `notify` and its owner's (one per distinct URL, the job's
    kinds and the owner's merged); None when nothing about the job is ever sent."""
    by_url: dict[str, set[NotifyOn]] = {}
    for notify in (spec.notify, owner_routes.get(spec.owner)):
        if notify is not None:
            by_url.setdefault(notify.url, set()).update(notify.on)
    sla_ms = None if spec.sla_s is None else round(spec.sla_s * 1000)
    routes = tuple(
        Route(url, frozenset(kind for kind in on if kind != "late" or sla_ms is not None))
        for url, on in sorted(by_url.items())
    )
    routes = tuple(r for r in routes if r.on)
    return Watch(spec.owner, routes, sla_ms) if routes else None


def watch_after(
    event: JobEvent, current: Watch | None, owner_routes: dict[str, Notify]
) -> Watch | None:
    """The job's watch after one of its job events. Only an upsert carries a spec; a pause
    or a resume leaves the watch as it was, since runs already decided still end (and
    fail) while the job is paused, and its alerts go on after the resume."""
    if event.kind == "deleted":
        return None
    if event.spec is None:
        return current
    return watch_for(event.spec, owner_routes)


def final_kind(event: RunEvent) -> NotifyOn | None:
    if event.state == "failed":
        return "lost" if event.reason.startswith("lost") else "failed"
    if event.state == "skipped":
        return "skipped"
    return None


def _alert(event: RunEvent, owner: str, kind: NotifyOn, delivery_id: str, at_ms: int) -> Alert:
    return Alert(
        delivery_id=delivery_id,
        kind=kind,
        job_id=event.job_id,
        owner=owner,
        run_id=event.run_id,
        scheduled_ms=event.scheduled_ms,
        attempt=event.attempt,
        state=event.state if kind != "late" else "not started",
        reason=event.reason,
        at_ms=at_ms,
        exit_code=event.exit_code,
    )


def late_id(run_id: str) -> str:
    return f"{run_id}:late"


@dataclass(frozen=True, slots=True)
class Seen(Generic[T]):
    """What one event did to the lateness watch: an alert when the event itself proves
    its run late; the token of the pending entry it resolved; whether it began one (its
    token is held until the entry is resolved or reported)."""

    alert: Alert | None
    freed: T | None
    held: bool


class Lateness(Generic[T]):
    """The runs of SLA jobs not yet started, by deadline. Pure: time comes in as
    arguments. Each pending run remembers a token (the notifier's: where its event was
    read) so the caller knows what is still unresolved."""

    def __init__(self) -> None:
        self._pending: dict[str, tuple[int, RunEvent, str, T]] = {}
        self._heap: list[tuple[int, str]] = []
        self._alerted: set[str] = set()  # runs already reported late (bounded below)

    def __len__(self) -> int:
        return len(self._pending)

    def tokens(self) -> Iterable[T]:
        return (token for _, _, _, token in self._pending.values())

    def observe(self, event: RunEvent, watch: Watch, token: T) -> Seen[T]:
        """Take one event of an SLA job (in the order of its partition)."""
        assert watch.sla_ms is not None
        deadline = event.scheduled_ms + watch.sla_ms
        run_id = event.run_id
        if event.state == "running" or event.state in FINAL_STATES:
            resolved = self._pending.pop(run_id, None)
            freed = None if resolved is None else resolved[3]
            # Late by the events: started after the deadline, or ended after it without
            # ever starting (a pending entry means no start was seen). When it started is
            # the worker's stamp (`happened_ms`), not when the ledger recorded it.
            started_late = event.state == "running" and event.attempt == 1
            ended_unstarted = event.state in FINAL_STATES and resolved is not None
            if (
                (started_late or ended_unstarted)
                and event.happened_ms > deadline
                and run_id not in self._alerted
            ):
                self._remember(run_id)
                alert = _alert(event, watch.owner, "late", late_id(run_id), event.at_ms)
                return Seen(alert, freed, held=False)
            return Seen(None, freed, held=False)
        if run_id not in self._pending and event.attempt == 1 and run_id not in self._alerted:
            self._pending[run_id] = (deadline, event, watch.owner, token)
            heapq.heappush(self._heap, (deadline, run_id))
            return Seen(None, None, held=True)
        return Seen(None, None, held=False)

    def due(self, now_ms: int) -> list[tuple[Alert, T]]:
        """Alerts of the pending runs whose deadline has passed, with their tokens."""
        found: list[tuple[Alert, T]] = []
        while self._heap and self._heap[0][0] <= now_ms:
            deadline, run_id = heapq.heappop(self._heap)
            entry = self._pending.get(run_id)
            if entry is None or entry[0] != deadline:
                continue  # resolved, or replaced
            del self._pending[run_id]
            _, event, owner, token = entry
            self._remember(run_id)
            found.append((_alert(event, owner, "late", late_id(run_id), deadline), token))
        return found

    def forget(self, drop: Callable[[T], bool]) -> None:
        """Drop the pending runs whose token `drop` names (their partition moved away)."""
        for run_id in [r for r, (_, _, _, token) in self._pending.items() if drop(token)]:
            del self._pending[run_id]

    def _remember(self, run_id: str) -> None:
        if len(self._alerted) > 100_000:  # a restart forgets them too: ids dedupe
            self._alerted.clear()
        self._alerted.add(run_id)


def final_alert(event: RunEvent, watch: Watch) -> tuple[Alert, tuple[Route, ...]] | None:
    """The alert of a final event and the routes that want it, or None."""
    kind = final_kind(event)
    if kind is None:
        return None
    routes = tuple(r for r in watch.routes if kind in r.on)
    if not routes:
        return None
    return _alert(event, watch.owner, kind, event.event_id, event.at_ms), routes


def late_routes(watch: Watch) -> tuple[Route, ...]:
    return tuple(r for r in watch.routes if "late" in r.on)


def backoff_s(attempt: int, base_s: float, cap_s: float) -> float:
    """The wait before delivery attempt `attempt + 1` (attempt >= 1): doubling from base."""
    return float(min(cap_s, base_s * 2 ** (attempt - 1)))
