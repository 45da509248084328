"""What the audit keeps of the replayed run-events (and the job events on it): per run
(`AuditedRun`), per job (`AuditedJob`), and the indexes its checks share (`History`).

Memory: per run, one small object with bit sets (seq numbers, attempts claimed and
started, who held and who ran each attempt: one shared worker id string and a bit set in
the common case) and a flag (the policy its firing was decided under); per job its
timeline (and a position per job event), its firings, 16 bytes per final event of a
non-manual run (the outcomes it notifies), 8 bytes per event that counts for
``max_runs`` (a run its schedule made, a firing revived or withdrawn), 8 bytes per
firing its schedule recorded (a run, or a skip: what a re-creation's watermark reads),
one dict entry per re-creation above its time and, for a ``forbid`` job, 24 bytes per
start of a run; entries only for runs started more than once or whose claims ended
without a start. Reports are judged as they come and not kept (but the findings' keys,
to report each execution once, up to 100,000).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Final, TypeAlias

from schemas.records import RunEvent
from schemas.spec import JobSpec

# Seq numbers and attempts are tracked as bits of an int; beyond this (never in practice)
# they are not tracked, so a forged huge number cannot make an enormous int.
MAX_TRACKED: Final = 4096


def bit(n: int) -> int:
    return 1 << n if 0 <= n < MAX_TRACKED else 0


# A start's mark (`AuditedJob.starts`): the attempt (`abs(mark) & ATTEMPT_MASK`), plus
# this for a run decided while its job allowed concurrency.
DECIDED_UNDER_ALLOW: Final = 1 << 32
ATTEMPT_MASK: Final = DECIDED_UNDER_ALLOW - 1

# `AuditedJob.counted`: 2 * scheduled_ms + one of these.
COUNTED: Final = 0
GIVEN_BACK: Final = 1


# `AuditedJob.decided`: 2 * scheduled_ms + one of these.
KEPT: Final = 0
WITHDRAWN_AHEAD: Final = 1


# A run's grants: None (no claim yet); one worker id (every claim of the run went to
# it), its flags per attempt in `gbits` (2 bits per attempt); or, once a second worker
# appears, a tuple of (attempt, worker, flags), the latest holder of an attempt last.
# (The flags and what is done with them: connectors/audit/grants.py.)
Grants: TypeAlias = str | tuple[tuple[int, str, int], ...] | None


class AuditedRun:
    __slots__ = (
        "attempt",
        "claimed",
        "forbid",
        "gbits",
        "grants",
        "job_id",
        "offset",
        "partition",
        "released",
        "scheduled_ms",
        "seq",
        "seqs",
        "since_ms",
        "started",
        "state",
    )

    def __init__(self, event: RunEvent, seq: int, partition: int, offset: int) -> None:
        self.job_id = event.job_id
        self.scheduled_ms = event.scheduled_ms
        self.state = event.state
        self.attempt = event.attempt
        self.seq = seq
        self.seqs = bit(seq)  # bit set of the seq numbers seen
        self.claimed = 0  # bit set of attempts with a `dispatched` event
        self.started = 0  # bit set of attempts with a `running` event
        self.since_ms = event.at_ms  # creation, or the latest rerun
        # Its firing was decided (created, or revived) while the job's concurrency was
        # `forbid` (set by connectors/audit/run_events.py; for a run first seen mid-life,
        # the policy in force then).
        self.forbid = False
        self.released = 0  # claims released before their start (dispatched -> due)
        self.grants: Grants = None
        self.gbits = 0
        self.partition = partition
        self.offset = offset


@dataclass(slots=True)
class AuditedJob:
    job_id: str
    partition: int
    offset: int  # the newest event of the job (where job-level violations point)
    # (kind, at_ms, spec) in log order
    timeline: list[tuple[str, int, JobSpec | None]] = field(default_factory=list)
    spec: JobSpec | None = None  # the newest upserted spec
    # scheduled_ms -> (run_id, created at_ms, partition, offset) of non-manual runs
    fires: dict[int, tuple[str, int, int, int]] = field(default_factory=dict)
    live: int = 0  # runs seen that are not final
    # Of those, the runs claimed and not started (`dispatched`): the ledger cancels such a
    # run only once its holder answers the stop order, so `replace` creates the new run
    # beside them.
    claimed: int = 0
    forbid: bool = False  # the newest spec's concurrency is `forbid`
    # The events that count for the spec's `max_runs` (connectors/audit/firings.py), in
    # log order, each 2 * scheduled_ms + COUNTED (a run its schedule made, a firing
    # revived) or + GIVEN_BACK (a scheduled run withdrawn before it was due).
    counted: array[int] = field(default_factory=lambda: array("q"))
    # Per job event (index-aligned with `timeline`): len(counted) when it came, so each
    # life of the job (from a registration on) knows its own counted events.
    marks: list[int] = field(default_factory=list)
    # The firings its schedule recorded (runs of trigger ``schedule``, any record: due,
    # waiting, skipped, ...), one per scheduled time, sorted: 2 * scheduled_ms +
    # WITHDRAWN_AHEAD while the run's latest event is a confirmed withdrawal, else + KEPT.
    decided: array[int] = field(default_factory=lambda: array("q"))
    # The time of the deletion in force (None while the job is not deleted), and per
    # re-creation (timeline index) the newest firing of the old life that stayed decided
    # when it is above the re-creation's time: where the new life starts firing
    # (connectors/audit/firings.py).
    deleted_ms: int | None = None
    floors: dict[int, int] = field(default_factory=dict)
    # (scheduled_ms, at_ms) of every final transition of a non-manual run, at_ms negated
    # minus one when not succeeded: the outcomes it notifies to its dependents.
    finals: array[int] = field(default_factory=lambda: array("q"))
    # (scheduled_ms, at_ms, mark) of every `running` event while the job forbids
    # concurrency; the mark is the attempt, plus DECIDED_UNDER_ALLOW for a run whose
    # firing was decided while the job allowed concurrency (it keeps that decision),
    # negated for a run not of its schedule (the ledger applies the policy to those only).
    starts: array[int] = field(default_factory=lambda: array("q"))
    # Once sealed: the starts of runs of its schedule decided under `forbid`, in time
    # order, with their scheduled times; and every start ordered by (scheduled_ms,
    # attempt): scheduled times, marks, starts.
    sealed: tuple[array[int], array[int], array[int], array[int], array[int]] | None = None


class History:
    """What run-events said, as the checks read it: its runs and jobs, and the indexes
    they share. Filled by `connectors/audit/checker.py` (job events) and
    `connectors/audit/run_events.py` (run events)."""

    def __init__(self) -> None:
        self.runs: dict[str, AuditedRun] = {}
        self.jobs: dict[str, AuditedJob] = {}
        self.workers: dict[str, str] = {}  # one string object per worker id
        # Runs first seen mid-life -> their first attempt seen (reports up to it unjudged).
        self.midlife: dict[str, int] = {}
        # Runs started more than once (retries, reruns) -> (attempt, at_ms, ...) of the
        # `running` events after the first: the starts of later attempts.
        self.later_starts: dict[str, tuple[int, ...]] = {}
        # Runs with claims that ended without a start -> (attempt, worker, how, at_ms).
        self.ended: dict[str, list[tuple[int, str, int, int]]] = {}
        # Start lateness of first attempts, in ms (connectors/audit/lateness.py).
        self.lateness = array("q")

    def intern(self, worker: str) -> str:
        """One string object per worker id, shared by the runs it held."""
        return self.workers.setdefault(worker, worker)
