"""The records the ledger reads (job-log) and writes (run-events, jobs, runs, dispatch).

Frozen dataclasses, the contract at the bottom of every import: the domain
(streams/core/) decides with them, the codecs beside them (schemas/codec.py) turn them
into Avro and back, and the loops never touch fastavro. Every record carries `at_ms`, the time its
producer stamped on it: the ledger takes time only from these, never from a clock, so a
replay makes the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

from schemas.spec import JobSpec, Resources

RunStateName: TypeAlias = Literal[
    "waiting",
    "due",
    "dispatched",
    "running",
    "retrying",
    "succeeded",
    "failed",
    "cancelled",
    "skipped",
]
FINAL_STATES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "skipped"})
# The legal run transitions, declared once: the ledger moves runs only along these, the
# audit flags any other, the simulation checks every event against them. None: a run's
# first event. Into `due` from a final state or `retrying` begins a new attempt (a retry,
# a rerun, a firing revived after a pause or schedule change cancelled it before its
# time); from `dispatched` it keeps the attempt (a claim released before the start).
TRANSITIONS: dict[str | None, frozenset[str]] = {
    None: frozenset({"due", "waiting", "skipped"}),
    "waiting": frozenset({"due", "skipped", "cancelled"}),
    "due": frozenset({"dispatched", "failed", "cancelled"}),
    "dispatched": frozenset({"due", "running", "succeeded", "failed", "retrying", "cancelled"}),
    "running": frozenset({"succeeded", "failed", "retrying", "cancelled"}),
    "retrying": frozenset({"due", "cancelled"}),
    "succeeded": frozenset({"due"}),
    "failed": frozenset({"due"}),
    # -> waiting: a withdrawn firing of a job with upstreams, revived (a new attempt).
    "cancelled": frozenset({"due", "waiting"}),
    "skipped": frozenset({"due"}),
}
Trigger: TypeAlias = Literal["schedule", "backfill", "manual", "dependency"]
DeadlineKind: TypeAlias = Literal["claim", "timeout", "retry", "dependency"]


# -- job-log: the ledger's input ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class JobUpserted:
    spec: JobSpec
    at_ms: int


@dataclass(frozen=True, slots=True)
class JobPaused:
    job_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class JobResumed:
    job_id: str
    at_ms: int
    # What becomes of the firings the pause covered: "skip" them, run the "last", or run
    # "all" (within the catch-up window).
    missed: str = "skip"


@dataclass(frozen=True, slots=True)
class JobDeleted:
    job_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class FireProposed:
    """A node believes (job, scheduled_ms) is due. May repeat, may be late."""

    job_id: str
    scheduled_ms: int
    at_ms: int
    proposer: str = ""


@dataclass(frozen=True, slots=True)
class RunNowRequested:
    job_id: str
    request_id: str
    at_ms: int
    params: tuple[tuple[str, str], ...] = ()  # given values, (name, JSON text), sorted


@dataclass(frozen=True, slots=True)
class BackfillRequested:
    job_id: str
    from_ms: int
    to_ms: int
    at_ms: int
    request_id: str = ""  # "" for requests written before backfills had one
    params: tuple[tuple[str, str], ...] = ()  # given values for every run it creates


@dataclass(frozen=True, slots=True)
class CancelRequested:
    job_id: str
    run_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class RerunRequested:
    job_id: str
    run_id: str
    request_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class ClaimRequested:
    """A worker asks to start (run, attempt). The first claim in the log wins."""

    job_id: str
    run_id: str
    attempt: int
    worker_id: str
    at_ms: int
    # The dispatcher's seal of this attempt's placement on this worker (streams/core/
    # seals.py), as the assignment carried it: the ledger grants nothing without it.
    placement: str = ""


@dataclass(frozen=True, slots=True)
class RunStarted:
    job_id: str
    run_id: str
    attempt: int
    worker_id: str
    at_ms: int
    # The seal of this attempt's placement on this worker (streams/core/seals.py), as
    # its assignment carried it: the ledger takes no report of an attempt without it.
    placement: str = ""


@dataclass(frozen=True, slots=True)
class RunFinished:
    job_id: str
    run_id: str
    attempt: int
    worker_id: str
    exit_code: int | None  # None when killed by a signal or never started
    error: str
    at_ms: int
    # The seal of this attempt's placement on this worker (streams/core/seals.py), as
    # its assignment carried it: the ledger takes no report of an attempt without it.
    placement: str = ""
    # The attempt's start, when this report stands for it too: a run that ended before
    # its worker sent the start (a short job's start is held briefly for its end, so one
    # record reports both). None: the start went in its own RunStarted, or none was made.
    started_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DeadlineReached:
    """A timer saw a run's deadline pass (claim not granted in time, run timeout, retry
    backoff over). Proposals like fires: stale ones are ignored."""

    job_id: str
    run_id: str
    attempt: int
    kind: DeadlineKind
    at_ms: int


@dataclass(frozen=True, slots=True)
class WorkerLost:
    """The dispatcher's verdict: `worker_id` is dead, and with it this attempt."""

    job_id: str
    run_id: str
    attempt: int
    worker_id: str
    at_ms: int
    # Broker time by which the worker's lease had ended, at the latest: an attempt whose
    # start time is later never started (None: not known, the verdict's time stands).
    lease_ended_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RunReleased:
    """The worker holding (run, attempt) releases it without having started it, and
    will never start it (fenced before its start, restarted before starting it, no room
    at its start time): the ledger dispatches the same attempt again."""

    job_id: str
    run_id: str
    attempt: int
    worker_id: str
    reason: str
    at_ms: int
    # The seal of this attempt's placement on this worker (streams/core/seals.py), as
    # its assignment carried it: the ledger takes no report of an attempt without it.
    placement: str = ""


@dataclass(frozen=True, slots=True)
class DependencyLinked:
    """Job `dependent` declares `job_id` an upstream (linked=False: no longer). Written by
    the dependent's ledger to the upstream's log, so the upstream knows whom to notify."""

    job_id: str
    dependent: str
    linked: bool
    at_ms: int
    # The dependent's owner: a registered upstream takes links only from its own owner's
    # jobs (None: a record from before the rule, taken as it was).
    owner: str | None = None
    # Empty: a link. Else a cycle probe (streams/core/ledger/dependencies.py): `dependent`
    # changed its upstreams at `at_ms`, and each job of the trail, `dependent` first,
    # depends on the next, the last on `job_id`. Nothing is linked by a probe.
    trail: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class UpstreamFinished:
    """The upstream's run for `scheduled_ms` reached a final state. Written by the
    upstream's ledger to the log of each dependent (`job_id`)."""

    job_id: str
    upstream: str
    scheduled_ms: int
    succeeded: bool
    at_ms: int
    # The upstream's next fire after scheduled_ms: a dependent whose period reaches it
    # waits for that later run instead.
    upstream_next_ms: int | None = None
    # The upstream's owner: a dependent takes outcomes only from its own owner's jobs.
    owner: str | None = None


@dataclass(frozen=True, slots=True)
class DispatchFailed:
    """The dispatcher found no worker that could ever run (run, attempt)."""

    job_id: str
    run_id: str
    attempt: int
    reason: str
    at_ms: int


LedgerInput: TypeAlias = (
    JobUpserted
    | JobPaused
    | JobResumed
    | JobDeleted
    | FireProposed
    | RunNowRequested
    | BackfillRequested
    | CancelRequested
    | RerunRequested
    | ClaimRequested
    | RunStarted
    | RunFinished
    | DeadlineReached
    | WorkerLost
    | DependencyLinked
    | UpstreamFinished
    | DispatchFailed
    | RunReleased
)


# -- state: compacted jobs and runs topics ------------------------------------------------
@dataclass(frozen=True, slots=True)
class UpstreamOutcome:
    upstream: str
    scheduled_ms: int
    succeeded: bool
    next_ms: int | None = None  # the upstream's next fire after scheduled_ms


@dataclass(frozen=True, slots=True)
class RecentRequest:
    """A run_now, rerun or backfill request the ledger applied, with its command's time."""

    request_id: str
    at_ms: int


@dataclass(frozen=True, slots=True)
class Span:
    """Scheduled times in (after_ms, until_ms]."""

    after_ms: int
    until_ms: int


@dataclass(frozen=True, slots=True)
class PendingBackfill:
    """A backfill accepted and not fully created yet: the times in (from_ms - 1, to_ms]
    are still to be looked at; `created` runs were made by it so far."""

    request_id: str
    from_ms: int
    to_ms: int
    at_ms: int
    created: int = 0
    params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class JobState:
    spec: JobSpec
    paused: bool
    deleted: bool
    created_ms: int
    updated_ms: int
    # Every scheduled time <= fired_ms has been decided (run created or skipped by
    # policy): the dedup watermark that survives compaction of finished runs.
    fired_ms: int
    next_due_ms: int | None  # the next scheduled time to propose, for the scheduler heap
    live_runs: tuple[str, ...]  # runs not yet final, oldest first (concurrency policy)
    final_runs: tuple[str, ...]  # the newest final runs still kept (rerun, late reports)
    # The newest requests applied (run_now, rerun, backfill), oldest first. A request is a
    # duplicate if it is here, or if its command is not newer than `requests_floor_ms`
    # (the newest command time among requests no longer remembered): the memory is
    # bounded, and a forgotten request can never be applied a second time.
    recent_requests: tuple[RecentRequest, ...]
    version: int  # transitions of this job (event ids)
    dependents: tuple[str, ...] = ()  # jobs that depend on this one (notified when runs end)
    # Recent final outcomes of this job's upstreams: an upstream may finish before the
    # downstream run of its period exists.
    upstream_outcomes: tuple[UpstreamOutcome, ...] = ()
    requests_floor_ms: int = 0
    # Scheduled times before the job's registration that backfills decided: a backfill
    # never decides a time twice, whether its runs are still kept or long forgotten.
    backfilled: tuple[Span, ...] = ()
    # The dependency cycle this job's last change closed, itself first and last (empty:
    # none). The change is refused: its upstreams are not in effect (its runs are skipped,
    # naming the cycle) until the job is changed again.
    cycle: tuple[str, ...] = ()
    # The cycle probes this job passed on lately ("origin@at_ms"): each passes a job once.
    probes: tuple[str, ...] = ()
    # Runs its schedule made (the spec's max_runs counts them).
    schedule_runs: int = 0
    # The newest scheduled time of a run forgotten (`keep_final_runs`): decided for
    # good, so no change moves the watermark back below it (its run would be made again).
    forgotten_ms: int = 0
    # Backfills accepted and not fully created, oldest first: a job holds at most
    # `LedgerConfig.backfill_live_runs` live backfill runs, and the queue's head goes on
    # as they finish (streams/core/ledger/firing.py, `Firing.pace_backfills`).
    backfill_queue: tuple[PendingBackfill, ...] = ()


@dataclass(frozen=True, slots=True)
class RunState:
    run_id: str
    job_id: str
    scheduled_ms: int
    trigger: Trigger
    state: RunStateName
    attempt: int
    worker_id: str  # who holds the current attempt's claim ("" before a claim)
    created_ms: int
    updated_ms: int
    deadline_ms: int | None  # when a DeadlineReached of `deadline_kind` is due
    deadline_kind: DeadlineKind | None
    started_ms: int | None
    finished_ms: int | None
    exit_code: int | None
    reason: str
    seq: int  # transitions so far: event ids are f"{run_id}#{seq}"
    request_id: str = ""
    # A waiting run depends on its upstreams' runs scheduled in (period_start_ms, scheduled].
    period_start_ms: int | None = None
    # The current attempt's start time (`not_before_ms` of its dispatch): no worker starts
    # it earlier. None in states written before this field existed.
    not_before_ms: int | None = None
    # Why the run is to be cancelled, once its holder answers the stop order sent for the
    # claimed attempt ("" when no cancel is pending). A claimed attempt that has not been
    # reported started may still start before the order reaches its worker, so the ledger
    # never ends it on its own word: the holder's answer (released, started, finished)
    # or the verdict that the worker is dead ends it, and so no execution escapes the record.
    cancelling: str = ""
    # The values of the job's parameters this run runs with (name, JSON text), sorted.
    params: tuple[tuple[str, str], ...] = ()
    # When the timeout backstop asked the holder of the current attempt for its answer
    # (a stop order) instead of failing it: its report may be only late (a broker outage
    # holds it), so the attempt fails for silence only if the grace passes once more with
    # the broker up and no answer. None: not asked.
    asked_ms: int | None = None

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


# -- outputs ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RunEvent:
    """One run transition, as it goes to run-events (the audit log)."""

    event_id: str
    job_id: str
    run_id: str
    scheduled_ms: int
    trigger: Trigger
    attempt: int
    state: RunStateName
    at_ms: int
    worker_id: str
    reason: str
    exit_code: int | None = None
    # When what a worker reported happened (its start or finish stamp), for the transition
    # that report decided; None for the ledger's own transitions (then it is `at_ms`).
    # Clamped by the ledger to what it can vouch for: no earlier than the attempt could
    # have started (its grant and its start time) or, for a finish, than its recorded
    # start; no later than `at_ms`, when the ledger recorded it. Under load the record can
    # trail the start by seconds; the history shows when the run started.
    reported_ms: int | None = None
    # The run's parameter values, on its first event only (the history records them once).
    params: tuple[tuple[str, str], ...] = ()

    @property
    def happened_ms(self) -> int:
        """When the transition happened: what the worker reported, else when recorded."""
        return self.at_ms if self.reported_ms is None else self.reported_ms


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A job change, as it goes to run-events."""

    event_id: str
    job_id: str
    kind: Literal["upserted", "paused", "resumed", "deleted"]
    at_ms: int
    spec: JobSpec | None


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """Place (run, attempt) on a worker; goes to `dispatch`, keyed by run_id."""

    run_id: str
    job_id: str
    attempt: int
    owner: str
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    resources: Resources
    timeout_s: float
    priority: int
    scheduled_ms: int
    not_before_ms: int  # start no earlier (pre-dispatch, jitter)
    at_ms: int
    secret_env: tuple[tuple[str, str], ...] = ()  # (env name, secret name): the worker resolves
    # Set by the dispatcher in the copy it assigns to a worker: the seal of this
    # attempt's placement on that worker (streams/core/seals.py); "" on `dispatch`.
    placement: str = ""


# -- worker-inbox: messages to one worker, keyed by worker_id ----------------------------
@dataclass(frozen=True, slots=True)
class WorkerAssignment:
    """The dispatcher placed (run, attempt) on this worker: claim it, then run it."""

    worker_id: str
    at_ms: int
    dispatch: DispatchRequest


@dataclass(frozen=True, slots=True)
class ClaimReply:
    """The ledger's answer to a claim: only a granted claim may start the run."""

    worker_id: str
    run_id: str
    attempt: int
    granted: bool
    reason: str
    at_ms: int
    # The claim's seal, echoed: a worker that forgot an attempt it was granted (killed
    # before its journal kept the claim) can still release it with proof.
    placement: str = ""


@dataclass(frozen=True, slots=True)
class CancelOrder:
    """A stop order: stop (run, attempt) if it runs here (cancelled, or no longer yours)."""

    worker_id: str
    run_id: str
    attempt: int
    reason: str
    at_ms: int


WorkerMessage: TypeAlias = WorkerAssignment | ClaimReply | CancelOrder


# -- heartbeats and run-logs: what a worker says of itself and of its runs' output -------
@dataclass(frozen=True, slots=True)
class WorkerCapacity:
    cpu: float
    memory_mb: int
    gpu: int = 0


@dataclass(frozen=True, slots=True)
class RunningAttempt:
    run_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A worker is alive (keyed by worker_id on `heartbeats`): what it has in all, what
    is free, its labels, and the attempts it holds (their reservations end there)."""

    worker_id: str
    at_ms: int
    capacity: WorkerCapacity
    free: WorkerCapacity
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value)
    running: tuple[RunningAttempt, ...] = ()
    # The start horizon (broker ms): once this beat is acknowledged the worker may start
    # held attempts whose start time is at most this, and never a later one before a
    # later beat is acknowledged, so a dead worker's verdict knows which of its attempts
    # never started. None: a worker from before the rule (its lease bounds its starts).
    armed_ms: int | None = None


LogStream: TypeAlias = Literal["stdout", "stderr"]


@dataclass(frozen=True, slots=True)
class RunLogChunk:
    """A bounded piece of one attempt's stdout or stderr (keyed by run_id on `run-logs`);
    `seq` counts the chunks of (run, attempt, stream) from 0."""

    run_id: str
    attempt: int
    stream: LogStream
    seq: int
    data: str  # UTF-8 text, undecodable bytes replaced
    truncated: bool  # output beyond the per-run limit was dropped after this chunk
    worker_id: str
    at_ms: int
