"""The pure arithmetic of the soak (bench/soak.py): what each fault kind cost, what the
jobs' own records of their executions show, and the verdict, from plain values only (no
broker, no process), so tests/unit/test_soak_prices.py can check it on made-up data.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from streams.core.percentile import nearest_rank_sorted

# After a fault ends its effects still show (a restarted node catching up, a lease
# running out): runs due this long after the end are charged to it too.
TAIL_MS = 30_000


@dataclass(frozen=True)
class Fault:
    kind: str
    what: str  # a human line: which process, how long
    target: str  # the process (node, worker id, broker) it hit; "" for PostgreSQL
    start_ms: int
    end_ms: int


@dataclass(frozen=True)
class RunFacts:
    """One scheduled run, as its events tell it."""

    run_id: str
    job_id: str
    scheduled_ms: int
    first_start_ms: int | None  # the first attempt's start (its reported time)
    attempts: int
    lost: bool  # an attempt failed because its worker was declared lost
    final: str  # the last state seen
    worker_id: str  # the last worker it ran on


@dataclass(frozen=True)
class Price:
    count: int
    runs_due: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    lost: int
    retried: int

    def as_json(self) -> dict[str, object]:
        return {
            "count": self.count,
            "runs_due": self.runs_due,
            "p50_s": _round(self.p50_s),
            "p99_s": _round(self.p99_s),
            "max_s": _round(self.max_s),
            "lost": self.lost,
            "retried": self.retried,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_facts(
    events: Iterable[tuple[str, str, str, int, str, int, int, str, str]],
) -> list[RunFacts]:
    """Runs from their events, oldest first: (run_id, job_id, trigger, scheduled_ms,
    state, attempt, happened_ms, worker_id, reason) each. Manual runs are left out:
    their scheduled time is when someone asked, not a firing."""
    first: dict[str, tuple[str, int]] = {}
    start: dict[str, int] = {}
    attempts: dict[str, int] = defaultdict(int)
    lost: set[str] = set()
    final: dict[str, str] = {}
    worker: dict[str, str] = {}
    for (
        run_id,
        job_id,
        trigger,
        scheduled_ms,
        state,
        attempt,
        happened_ms,
        worker_id,
        reason,
    ) in events:
        if trigger == "manual":
            continue
        first.setdefault(run_id, (job_id, scheduled_ms))
        attempts[run_id] = max(attempts[run_id], attempt)
        final[run_id] = state
        if worker_id:
            worker[run_id] = worker_id
        if state == "running" and attempt == 1:
            start.setdefault(run_id, happened_ms)
        if reason.startswith("lost"):
            lost.add(run_id)
    return [
        RunFacts(
            run_id,
            job_id,
            scheduled_ms,
            start.get(run_id),
            attempts[run_id],
            run_id in lost,
            final[run_id],
            worker.get(run_id, ""),
        )
        for run_id, (job_id, scheduled_ms) in first.items()
    ]


def summarize(count: int, due: list[RunFacts]) -> Price:
    """The price of `count` faults that the runs `due` came due under."""
    late = sorted(
        (r.first_start_ms - r.scheduled_ms) / 1000 for r in due if r.first_start_ms is not None
    )
    return Price(
        count=count,
        runs_due=len(due),
        p50_s=nearest_rank_sorted(late, 0.5) if late else None,
        p99_s=nearest_rank_sorted(late, 0.99) if late else None,
        max_s=late[-1] if late else None,
        lost=sum(r.lost for r in due),
        retried=sum(r.attempts > 1 for r in due),
    )


def _inside(run: RunFacts, windows: list[tuple[int, int]]) -> bool:
    return any(a <= run.scheduled_ms < b for a, b in windows)


def price_table(
    faults: list[Fault], runs: list[RunFacts], tail_ms: int = TAIL_MS
) -> dict[str, Price]:
    """Per fault kind (in the order they first happened), its price: the runs due from
    each fault's start to its end plus the tail, each run counted once per kind even
    where windows overlap; and "none", the baseline: the runs due outside every fault's
    window."""
    kinds: dict[str, list[tuple[int, int]]] = {}
    for f in faults:
        kinds.setdefault(f.kind, []).append((f.start_ms, f.end_ms + tail_ms))
    table = {
        kind: summarize(len(windows), [r for r in runs if _inside(r, windows)])
        for kind, windows in kinds.items()
    }
    every = [w for windows in kinds.values() for w in windows]
    table["none"] = summarize(0, [r for r in runs if not _inside(r, every)])
    return table


@dataclass(frozen=True)
class Mark:
    """One line a job wrote about itself: its run, attempt, `s`tart or `e`nd, and when
    (ns, the machine's true clock: jobs do not inherit a node's skewed clock)."""

    job_id: str
    run_id: str
    attempt: int
    edge: str
    at_ns: int


def parse_marks(job_id: str, text: str) -> list[Mark]:
    """The lines of one job's file (`RUN ATTEMPT s|e NS`); a torn last line (the job
    killed mid-write) is skipped."""
    found = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in ("s", "e") and parts[1].isdigit() and parts[3].isdigit():
            found.append(Mark(job_id, parts[0], int(parts[1]), parts[2], int(parts[3])))
    return found


def executed_twice(marks: Iterable[Mark]) -> list[str]:
    """Attempts whose job started more than once: a run's attempt must execute once."""
    starts: dict[tuple[str, int], int] = defaultdict(int)
    for m in marks:
        if m.edge == "s":
            starts[(m.run_id, m.attempt)] += 1
    return sorted(
        f"{run}#{attempt} started {n} times" for (run, attempt), n in starts.items() if n > 1
    )


def overlaps(marks: Iterable[Mark], forbid: set[str]) -> list[str]:
    """For jobs with `concurrency: forbid`, two executions of the job at once (by the
    jobs' own start and end marks; an execution with no end mark lasts to the next
    start of the job, a conservative reading that cannot hide an overlap)."""
    spans: dict[str, dict[tuple[str, int], list[int]]] = defaultdict(dict)
    for m in marks:
        if m.job_id not in forbid:
            continue
        span = spans[m.job_id].setdefault((m.run_id, m.attempt), [0, 0])
        span[0 if m.edge == "s" else 1] = m.at_ns
    found = []
    for job_id, by_attempt in spans.items():
        ordered = sorted((s, e, key) for key, (s, e) in by_attempt.items() if s)
        # The execution reaching furthest so far: a long one may cover several later.
        reach, holder = 0, ("", 0)
        for start, end, key in ordered:
            if start < reach:
                found.append(f"{job_id}: {holder[0]}#{holder[1]} and {key[0]}#{key[1]} overlap")
            if end > reach:
                reach, holder = end, key
    return found


def killed_long_runs(
    long_runs: Iterable[RunFacts],
    ends_ms: Mapping[str, int],
    faults: list[Fault],
    fatal: frozenset[str],
) -> list[str]:
    """Long runs that did not succeed though no fault that may kill a job hit their
    worker while they ran: `fatal` are the kinds the docs say a running job does not
    survive (its worker killed, stopped or cut off past its lease), applied to the
    run's own worker. Runs with no start are not judged here (missed/final checks are)."""
    found = []
    for run in long_runs:
        if run.final == "succeeded" or run.first_start_ms is None:
            continue
        end = ends_ms.get(run.run_id, 1 << 62)
        excused = any(
            f.kind in fatal
            and f.target == run.worker_id
            and f.start_ms <= end
            and f.end_ms + TAIL_MS >= run.first_start_ms
            for f in faults
        )
        if not excused:
            found.append(f"{run.run_id}: {run.final} on {run.worker_id}")
    return found


def tally(checks: Mapping[str, list[str]]) -> tuple[int, dict[str, int], dict[str, list[str]]]:
    """(total violations, count per check, up to three examples per failing check)."""
    counts = {name: len(found) for name, found in checks.items()}
    examples = {name: found[:3] for name, found in checks.items() if found}
    return sum(counts.values()), counts, examples


def final_line(
    firings: int, violations: int, table: Mapping[str, Price], audit: str
) -> dict[str, object]:
    """The last line the soak prints: one JSON object scripts read."""
    return {
        "firings": firings,
        "violations": violations,
        "faults": {kind: p.as_json() for kind, p in table.items()},
        "audit": audit,
    }
