"""Typed, frozen job specifications (the fields of a `job.upsert` command).

Times are UTC epoch milliseconds (int) everywhere in the domain: exact, hashable, cheap
to compare, and what Avro's timestamp-millis carries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, TypeAlias

MisfirePolicy: TypeAlias = Literal["run_all", "run_once", "skip"]
ConcurrencyPolicy: TypeAlias = Literal["allow", "forbid", "replace"]
# What a wall-clock time that does not exist (spring forward) or exists twice (fall back)
# does: run_once = at the shifted time / the first occurrence; skip = not at all;
# both = like run_once for a gap, at both occurrences for a repeat; auto (the default) =
# cron's rule: a job whose minute or hour field is a wildcard or a step follows elapsed
# time (it fires at every instant whose wall time matches: twice in a repeat, not for a
# gap's wall times), any other job is fixed-time and behaves as run_once. Details in
# streams/core/schedule.py.
DstPolicy: TypeAlias = Literal["run_once", "skip", "both", "auto"]

MISFIRE_POLICIES: tuple[MisfirePolicy, ...] = ("run_all", "run_once", "skip")
CONCURRENCY_POLICIES: tuple[ConcurrencyPolicy, ...] = ("allow", "forbid", "replace")
DST_POLICIES: tuple[DstPolicy, ...] = ("run_once", "skip", "both", "auto")


@dataclass(frozen=True, slots=True)
class CronSchedule:
    """5 fields, or 6 with leading seconds; evaluated in `timezone` (IANA name)."""

    expr: str
    timezone: str = "UTC"
    # Bounds (epoch ms, inclusive): no fire time before start_ms or after end_ms.
    start_ms: int | None = None
    end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class EverySchedule:
    """Fires at every multiple of `every_ms` since the Unix epoch: anchored, so it never
    drifts, and every node computes the same instants."""

    every_ms: int
    start_ms: int | None = None  # bounds, as for CronSchedule
    end_ms: int | None = None


@dataclass(frozen=True, slots=True)
class AtSchedule:
    """A one-off firing."""

    at_ms: int


# None: the job has no schedule of its own and runs when its upstreams succeeded.
Schedule: TypeAlias = CronSchedule | EverySchedule | AtSchedule | None


@dataclass(frozen=True, slots=True)
class Resources:
    cpu: float = 0.0
    memory_mb: int = 0
    gpu: int = 0
    labels: tuple[tuple[str, str], ...] = ()  # sorted (key, value) pairs


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    max_attempts: int = 1
    backoff_s: float = 10.0
    backoff_multiplier: float = 2.0
    max_backoff_s: float = 600.0


NotifyOn: TypeAlias = Literal["failed", "lost", "skipped", "late"]
NOTIFY_ON: tuple[NotifyOn, ...] = ("failed", "lost", "skipped", "late")


@dataclass(frozen=True, slots=True)
class Notify:
    """A webhook `cronlog notifier` calls when one of this job's runs ends `on` one of
    these: failed (for good, retries spent), lost (its worker vanished and it is not run
    again), skipped (a misfire or concurrency policy), late (not started within the
    job's `sla_s` of its time)."""

    url: str
    on: tuple[NotifyOn, ...]


@dataclass(frozen=True, slots=True)
class Exclusion:
    """Days a job's schedule does not run: `first` to `last` (YYYY-MM-DD, inclusive) in
    the schedule's time zone; `name` (a calendar's, "exclude" if none) is the reason its
    skipped firings give."""

    name: str
    first: str
    last: str


ParamType: TypeAlias = Literal["string", "integer", "number", "boolean"]


@dataclass(frozen=True, slots=True)
class Param:
    """A run parameter a job declares: its value's type, and its default as JSON text
    (None: every run must be given it)."""

    name: str
    type: ParamType
    default: str | None = None


@dataclass(frozen=True, slots=True)
class JobSpec:
    job_id: str
    owner: str
    schedule: Schedule
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # sorted (name, value) pairs
    resources: Resources = field(default_factory=Resources)
    timeout_s: float = 3600.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    idempotent: bool = False
    depends_on: tuple[str, ...] = ()
    misfire: MisfirePolicy = "run_once"
    concurrency: ConcurrencyPolicy = "allow"
    dst: DstPolicy = "auto"
    jitter_s: float = 0.0
    priority: int = 0
    notify: Notify | None = None
    sla_s: float | None = None  # a run not started this long after its time is late
    # Env vars whose value is a secret the worker resolves (sorted (env name, secret
    # name) pairs): only the name travels on topics and sits in projections.
    secret_env: tuple[tuple[str, str], ...] = ()
    # Who keeps this job's definition ("" : by hand): `cronlog apply` writes its name, and
    # its --prune deletes only jobs that carry that name and its files no longer list.
    managed_by: str = ""
    # Declared run parameters (streams/core/params.py), by name; with params_in_command,
    # `{name}` in the command's arguments is replaced by the run's value.
    params: tuple[Param, ...] = ()
    params_in_command: bool = False
    # Calendar rules of the schedule: days it does not run (recorded as skipped, naming
    # the calendar), and how many runs it makes at most (None: no limit).
    exclude: tuple[Exclusion, ...] = ()
    max_runs: int | None = None
