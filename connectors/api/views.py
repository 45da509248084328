"""What the web dashboard (connectors/api/ui.py) shows, computed without I/O: a job's
schedule in words, the lateness histogram's bins, and the layered drawing of the
dependency graph. Pure functions over the API service's rows, so they get unit and
property tests of their own and the templates only lay them out.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from streams.core.dag import cycle_through

# Upper bounds of the histogram's bins in seconds (the last bin is open): fine where a
# healthy scheduler lives (under a second), coarse where an operator only needs "late".
LATENESS_BOUNDS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


def schedule_text(schedule: Mapping[str, Any] | None) -> str:
    """The projection's JSON schedule as an operator reads it."""
    if not schedule:
        return "after its upstreams"
    if "cron" in schedule:
        return f"cron {schedule['cron']} ({schedule.get('timezone', 'UTC')})"
    if "every_ms" in schedule:
        ms = int(schedule["every_ms"])
        for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                return f"every {ms // size}{unit}"
        return f"every {ms}ms"
    if "at_ms" in schedule:
        at = datetime.fromtimestamp(int(schedule["at_ms"]) / 1000, UTC)
        return f"once at {at.isoformat().replace('+00:00', 'Z')}"
    return str(dict(schedule))


@dataclass(frozen=True, slots=True)
class Bin:
    label: str
    count: int
    height: float  # 0..1 of the tallest bin


def lateness_bins(lateness_s: Iterable[float]) -> list[Bin]:
    """Start lateness counted into LATENESS_BOUNDS_S: bin i holds (bound[i-1], bound[i]],
    the first everything <= 0.1 s (early starts included), the last everything above
    60 s."""
    counts = [0] * (len(LATENESS_BOUNDS_S) + 1)
    for value in lateness_s:
        counts[bisect.bisect_left(LATENESS_BOUNDS_S, value)] += 1
    labels = [f"≤{_seconds(b)}" for b in LATENESS_BOUNDS_S] + [
        f">{_seconds(LATENESS_BOUNDS_S[-1])}"
    ]
    top = max(counts) or 1
    return [Bin(label, n, n / top) for label, n in zip(labels, counts, strict=True)]


def _seconds(bound: float) -> str:
    return f"{bound:g}s"


@dataclass(frozen=True, slots=True)
class Node:
    job_id: str
    layer: int
    row: int
    missing: bool  # named as an upstream but not a job the caller can see


@dataclass(frozen=True, slots=True)
class Layout:
    nodes: tuple[Node, ...]
    edges: tuple[tuple[str, str], ...]  # (upstream, downstream)
    layers: int
    rows: int
    # Each dependency cycle once, as the path job -> ... -> job (the API refuses them;
    # commands written to the topic directly are not checked against the graph).
    cycles: tuple[tuple[str, ...], ...] = ()

    def on_cycle(self, upstream: str, downstream: str) -> bool:
        """Whether the edge is one of a cycle's (drawn so the page shows it)."""
        return any(
            (c[i + 1], c[i]) == (upstream, downstream)
            for c in self.cycles
            for i in range(len(c) - 1)
        )


def dependency_layout(depends_on: Mapping[str, Sequence[str]]) -> Layout:
    """Jobs in layers so that every edge points to a later layer: a job's layer is one more
    than its deepest upstream's (0 for a job with none). The API refuses cycles, but one
    may come through the commands topic or two concurrent changes: a job on a cycle is
    placed after what is already placed instead of looping, and the cycle is named."""
    known = set(depends_on)
    upstreams = {job: tuple(dict.fromkeys(ups)) for job, ups in depends_on.items()}
    missing = sorted({u for ups in upstreams.values() for u in ups} - known)
    layer: dict[str, int] = dict.fromkeys(missing, 0)

    def place(job: str, path: frozenset[str]) -> int:
        if job in layer:
            return layer[job]
        ups = [u for u in upstreams.get(job, ()) if u not in path]
        depth = 1 + max((place(u, path | {job}) for u in ups), default=-1)
        layer[job] = depth
        return depth

    for job in sorted(known):
        place(job, frozenset())
    by_layer: dict[int, list[str]] = {}
    for job in sorted(layer):
        by_layer.setdefault(layer[job], []).append(job)
    nodes = tuple(
        Node(job, n, row, job in missing)
        for n, jobs in sorted(by_layer.items())
        for row, job in enumerate(jobs)
    )
    edges = tuple((u, job) for job in sorted(known) for u in upstreams[job])
    cycles: list[tuple[str, ...]] = []
    for job in sorted(known):
        if any(job in c for c in cycles):
            continue
        others = {j: ups for j, ups in upstreams.items() if j != job}
        cycle = cycle_through(job, upstreams[job], others)
        if cycle is not None:
            cycles.append(cycle)
    return Layout(
        nodes,
        edges,
        layers=max(by_layer, default=-1) + 1,
        rows=max((len(v) for v in by_layer.values()), default=0),
        cycles=tuple(cycles),
    )


def detail_text(detail: Mapping[str, Any] | None) -> str:
    """A transition's detail as words: its reason and exit code, nothing when neither."""
    if not detail:
        return ""
    words = [str(detail["reason"])] if detail.get("reason") else []
    if detail.get("exit_code") is not None:
        words.append(f"exit {detail['exit_code']}")
    return " · ".join(words)


def duration_text(started: str | None, finished: str | None) -> str:
    """How long a run took, from its ISO start and end ("" unless both are known)."""
    if not started or not finished:
        return ""
    seconds = (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds()
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(int(seconds), 60)
    return f"{minutes} min {rest} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def ahead(run: Mapping[str, Any], now: datetime) -> bool:
    """A run created before its time (pre-dispatch, the look-ahead) not started yet."""
    scheduled = run.get("scheduled_at")
    return (
        scheduled is not None
        and run.get("state") in ("waiting", "due", "dispatched")
        and datetime.fromisoformat(scheduled) > now
    )


def logs_by_attempt(chunks: Iterable[Mapping[str, Any]]) -> list[tuple[int, str]]:
    """A run's log chunks (in order) as one text per attempt, oldest attempt first."""
    texts: dict[int, list[str]] = {}
    for chunk in chunks:
        texts.setdefault(int(chunk["attempt"]), []).append(str(chunk["data"]))
    return [(attempt, "".join(parts)) for attempt, parts in sorted(texts.items())]
