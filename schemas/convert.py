"""Frozen dataclasses <-> the plain dicts fastavro writes and reads (no fastavro here).

Field names are the dataclasses' own; tuples of pairs (env, labels) are maps and come
back as sorted tuples of pairs; arrays come back as tuples. A union of record types is
fastavro's tuple notation (full name, dict), both ways.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any, Final, TypeAlias, TypeVar, cast

from schemas.records import (
    BackfillRequested,
    CancelOrder,
    CancelRequested,
    ClaimReply,
    ClaimRequested,
    DeadlineReached,
    DependencyLinked,
    DispatchFailed,
    DispatchRequest,
    FireProposed,
    Heartbeat,
    JobDeleted,
    JobEvent,
    JobPaused,
    JobResumed,
    JobState,
    JobUpserted,
    LedgerInput,
    PendingBackfill,
    RecentRequest,
    RerunRequested,
    RunEvent,
    RunFinished,
    RunLogChunk,
    RunningAttempt,
    RunNowRequested,
    RunReleased,
    RunStarted,
    RunState,
    Span,
    UpstreamFinished,
    UpstreamOutcome,
    WorkerAssignment,
    WorkerCapacity,
    WorkerLost,
)
from schemas.spec import (
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Exclusion,
    JobSpec,
    Notify,
    Param,
    Resources,
    RetryPolicy,
    Schedule,
)

NAMESPACE = "dev.cronlog"
AvroDict: TypeAlias = dict[str, Any]
Named: TypeAlias = tuple[str, AvroDict]  # fastavro's union tuple notation
T = TypeVar("T")

CRON = f"{NAMESPACE}.CronSchedule"
EVERY = f"{NAMESPACE}.EverySchedule"
AT = f"{NAMESPACE}.AtSchedule"
RECENT_REQUEST = f"{NAMESPACE}.RecentRequest"


def pairs(mapping: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(mapping.items()))


def schedule_to_avro(schedule: Schedule) -> Named | None:
    if schedule is None:
        return None
    if isinstance(schedule, CronSchedule):
        bounds = {"start_ms": schedule.start_ms, "end_ms": schedule.end_ms}
        return CRON, {"expr": schedule.expr, "timezone": schedule.timezone, **bounds}
    if isinstance(schedule, EverySchedule):
        bounds = {"start_ms": schedule.start_ms, "end_ms": schedule.end_ms}
        return EVERY, {"every_ms": schedule.every_ms, **bounds}
    return AT, {"at_ms": schedule.at_ms}


# Decoded values that many jobs have in common (an owner, a cron expression and time
# zone, a command, the default resources and retry policy) are kept once and shared by
# every spec that has them: the ledger holds every registered job's spec in memory, and
# a fresh copy of each part per job would be most of a job's memory. All of them
# are immutable (frozen records, tuples, strings). Bounded: beyond `_SHARED_MAX` distinct
# values new ones are simply not shared.
_SHARED_MAX: Final = 200_000
_shared: dict[Any, Any] = {}


def shared(value: T) -> T:
    """The one kept object equal to `value` (`value` itself the first time)."""
    key = (type(value), value)  # never 1.0 for a 1, nor one record type for another
    kept = _shared.get(key)
    if kept is not None:
        return cast(T, kept)
    if len(_shared) < _SHARED_MAX:
        _shared[key] = value
    return value


def schedule_from_avro(value: Named | None) -> Schedule:
    if value is None:
        return None
    name, d = value
    if name == CRON:
        bounds = d.get("start_ms"), d.get("end_ms")
        return shared(CronSchedule(d["expr"], d["timezone"], *bounds))
    if name == EVERY:
        return shared(EverySchedule(d["every_ms"], d.get("start_ms"), d.get("end_ms")))
    if name == AT:
        return AtSchedule(d["at_ms"])
    raise ValueError(f"unknown schedule type {name!r}")


def resources_to_avro(r: Resources) -> AvroDict:
    return {"cpu": r.cpu, "memory_mb": r.memory_mb, "gpu": r.gpu, "labels": dict(r.labels)}


def resources_from_avro(d: AvroDict) -> Resources:
    return shared(Resources(float(d["cpu"]), d["memory_mb"], d["gpu"], pairs(d["labels"])))


def spec_to_avro(s: JobSpec) -> AvroDict:
    retry = s.retry
    return {
        "job_id": s.job_id,
        "owner": s.owner,
        "schedule": schedule_to_avro(s.schedule),
        "command": s.command,
        "env": dict(s.env),
        "resources": resources_to_avro(s.resources),
        "timeout_s": s.timeout_s,
        "retry": {
            "max_attempts": retry.max_attempts,
            "backoff_s": retry.backoff_s,
            "backoff_multiplier": retry.backoff_multiplier,
            "max_backoff_s": retry.max_backoff_s,
        },
        "idempotent": s.idempotent,
        "depends_on": s.depends_on,
        "misfire": s.misfire,
        "concurrency": s.concurrency,
        "dst": s.dst,
        "jitter_s": s.jitter_s,
        "priority": s.priority,
        "notify": None if s.notify is None else {"url": s.notify.url, "on": list(s.notify.on)},
        "sla_s": s.sla_s,
        "secret_env": dict(s.secret_env),
        "managed_by": s.managed_by,
        "params": [{"name": p.name, "type": p.type, "default": p.default} for p in s.params],
        "params_in_command": s.params_in_command,
        "exclude": [{"name": e.name, "first": e.first, "last": e.last} for e in s.exclude],
        "max_runs": s.max_runs,
    }


def spec_from_avro(d: AvroDict) -> JobSpec:
    retry = d["retry"]
    return JobSpec(
        job_id=d["job_id"],
        owner=shared(d["owner"]),
        schedule=schedule_from_avro(d["schedule"]),
        command=shared(tuple(d["command"])),
        env=shared(pairs(d["env"])),
        resources=resources_from_avro(d["resources"]),
        timeout_s=shared(float(d["timeout_s"])),
        retry=shared(
            RetryPolicy(
                retry["max_attempts"],
                float(retry["backoff_s"]),
                float(retry["backoff_multiplier"]),
                float(retry["max_backoff_s"]),
            )
        ),
        idempotent=d["idempotent"],
        depends_on=shared(tuple(d["depends_on"])),
        misfire=d["misfire"],
        concurrency=d["concurrency"],
        dst=d["dst"],
        jitter_s=shared(float(d["jitter_s"])),
        priority=d["priority"],
        notify=_notify_from_avro(d.get("notify")),
        sla_s=None if d.get("sla_s") is None else float(d["sla_s"]),
        secret_env=shared(pairs(d.get("secret_env") or {})),
        managed_by=shared(d.get("managed_by") or ""),
        params=shared(
            tuple(Param(p["name"], p["type"], p.get("default")) for p in d.get("params") or ())
        ),
        params_in_command=bool(d.get("params_in_command", False)),
        exclude=shared(
            tuple(Exclusion(e["name"], e["first"], e["last"]) for e in d.get("exclude") or ())
        ),
        max_runs=d.get("max_runs"),
    )


def _notify_from_avro(d: AvroDict | None) -> Notify | None:
    return None if d is None else shared(Notify(d["url"], tuple(d["on"])))


# -- flat records: every field a primitive, an enum symbol or None -----------------------
def _flat(
    cls: type[Any], tuples: tuple[str, ...] = ()
) -> tuple[Callable[[Any], AvroDict], Callable[[AvroDict], Any]]:
    """Field for field; the `tuples` fields (Avro arrays) read back as tuples, and a
    `params` field (an Avro map) is a sorted tuple of (name, value) pairs."""
    names = tuple(f.name for f in fields(cls))
    maps = ("params",) if "params" in names else ()

    def to_avro(record: Any) -> AvroDict:
        d = {n: getattr(record, n) for n in names}
        for n in maps:
            d[n] = dict(d[n])
        return d

    def from_avro(d: AvroDict) -> Any:
        values = {n: tuple(d[n]) if n in tuples else d[n] for n in names}
        for n in maps:
            values[n] = tuple(sorted((d.get(n) or {}).items()))
        return cls(**values)

    return to_avro, from_avro


def job_upserted_to_avro(r: JobUpserted) -> AvroDict:
    return {"spec": spec_to_avro(r.spec), "at_ms": r.at_ms}


def job_upserted_from_avro(d: AvroDict) -> JobUpserted:
    return JobUpserted(spec_from_avro(d["spec"]), d["at_ms"])


def job_state_to_avro(s: JobState) -> AvroDict:
    return {"spec": spec_to_avro(s.spec), **job_state_rest_to_avro(s)}


def job_state_rest_to_avro(s: JobState) -> AvroDict:
    """Every field of a job state but its spec (the spec is encoded apart, once per
    version: schemas.codec.JobStateCodec)."""
    return {
        "paused": s.paused,
        "deleted": s.deleted,
        "created_ms": s.created_ms,
        "updated_ms": s.updated_ms,
        "fired_ms": s.fired_ms,
        "next_due_ms": s.next_due_ms,
        "live_runs": s.live_runs,
        "final_runs": s.final_runs,
        "recent_requests": [
            (RECENT_REQUEST, {"request_id": r.request_id, "at_ms": r.at_ms})
            for r in s.recent_requests
        ],
        "requests_floor_ms": s.requests_floor_ms,
        "backfilled": [{"after_ms": b.after_ms, "until_ms": b.until_ms} for b in s.backfilled],
        "version": s.version,
        "dependents": s.dependents,
        "cycle": s.cycle,
        "probes": s.probes,
        "schedule_runs": s.schedule_runs,
        "forgotten_ms": s.forgotten_ms,
        "backfill_queue": [
            {
                "request_id": b.request_id,
                "from_ms": b.from_ms,
                "to_ms": b.to_ms,
                "at_ms": b.at_ms,
                "created": b.created,
                "params": dict(b.params),
            }
            for b in s.backfill_queue
        ],
        "upstream_outcomes": [
            {
                "upstream": o.upstream,
                "scheduled_ms": o.scheduled_ms,
                "succeeded": o.succeeded,
                "next_ms": o.next_ms,
            }
            for o in s.upstream_outcomes
        ],
    }


def job_state_from_avro(d: AvroDict) -> JobState:
    return job_state_from_rest(spec_from_avro(d["spec"]), d)


def job_state_from_rest(spec: JobSpec, d: AvroDict) -> JobState:
    """A job state of `spec` and the other fields (`d`'s spec, if any, is not read)."""
    return JobState(
        spec=spec,
        paused=d["paused"],
        deleted=d["deleted"],
        created_ms=d["created_ms"],
        updated_ms=d["updated_ms"],
        fired_ms=d["fired_ms"],
        next_due_ms=d["next_due_ms"],
        live_runs=tuple(d["live_runs"]),
        final_runs=tuple(d["final_runs"]),
        recent_requests=tuple(_request(r, d["updated_ms"]) for r in d["recent_requests"]),
        version=d["version"],
        dependents=tuple(d["dependents"]),
        upstream_outcomes=tuple(
            UpstreamOutcome(o["upstream"], o["scheduled_ms"], o["succeeded"], o["next_ms"])
            for o in d["upstream_outcomes"]
        ),
        requests_floor_ms=d["requests_floor_ms"],
        backfilled=tuple(Span(b["after_ms"], b["until_ms"]) for b in d["backfilled"]),
        cycle=tuple(d["cycle"]),
        probes=tuple(d["probes"]),
        schedule_runs=d["schedule_runs"],
        forgotten_ms=d["forgotten_ms"],
        backfill_queue=tuple(
            PendingBackfill(
                b["request_id"],
                b["from_ms"],
                b["to_ms"],
                b["at_ms"],
                b["created"],
                tuple(sorted((b.get("params") or {}).items())),
            )
            for b in d.get("backfill_queue") or ()
        ),
    )


def _request(value: str | Named | list[Any] | AvroDict, updated_ms: int) -> RecentRequest:
    """A remembered request; a bare id (kept before requests had times) counts as made
    at the state's last update. (JSON turns the union's (name, record) into a list.)"""
    if isinstance(value, str):
        return RecentRequest(value, updated_ms)
    record = value[1] if isinstance(value, tuple | list) else value
    return RecentRequest(record["request_id"], record["at_ms"])


def job_event_to_avro(e: JobEvent) -> AvroDict:
    return {
        "event_id": e.event_id,
        "job_id": e.job_id,
        "kind": e.kind,
        "at_ms": e.at_ms,
        "spec": None if e.spec is None else spec_to_avro(e.spec),
    }


def job_event_from_avro(d: AvroDict) -> JobEvent:
    spec = d["spec"]
    return JobEvent(
        d["event_id"],
        d["job_id"],
        d["kind"],
        d["at_ms"],
        None if spec is None else spec_from_avro(spec),
    )


def dispatch_to_avro(r: DispatchRequest) -> AvroDict:
    return {
        "run_id": r.run_id,
        "job_id": r.job_id,
        "attempt": r.attempt,
        "owner": r.owner,
        "command": r.command,
        "env": dict(r.env),
        "resources": resources_to_avro(r.resources),
        "timeout_s": r.timeout_s,
        "priority": r.priority,
        "scheduled_ms": r.scheduled_ms,
        "not_before_ms": r.not_before_ms,
        "at_ms": r.at_ms,
        "secret_env": dict(r.secret_env),
        "placement": r.placement,
    }


def dispatch_from_avro(d: AvroDict) -> DispatchRequest:
    return DispatchRequest(
        run_id=d["run_id"],
        job_id=d["job_id"],
        attempt=d["attempt"],
        owner=d["owner"],
        command=tuple(d["command"]),
        env=pairs(d["env"]),
        resources=resources_from_avro(d["resources"]),
        timeout_s=shared(float(d["timeout_s"])),
        priority=d["priority"],
        scheduled_ms=d["scheduled_ms"],
        not_before_ms=d["not_before_ms"],
        at_ms=d["at_ms"],
        secret_env=pairs(d.get("secret_env") or {}),
        placement=d.get("placement") or "",
    )


run_state_to_avro, run_state_from_avro = _flat(RunState)
run_log_to_avro, run_log_from_avro = _flat(RunLogChunk)


def _capacity_from_avro(d: AvroDict) -> WorkerCapacity:
    return WorkerCapacity(float(d["cpu"]), int(d["memory_mb"]), int(d.get("gpu", 0)))


def heartbeat_to_avro(b: Heartbeat) -> AvroDict:
    return {
        "worker_id": b.worker_id,
        "at_ms": b.at_ms,
        "capacity": capacity_to_avro(b.capacity),
        "free": capacity_to_avro(b.free),
        "labels": dict(b.labels),
        "armed_ms": b.armed_ms,
        "running": [{"run_id": r.run_id, "attempt": r.attempt} for r in b.running],
    }


def capacity_to_avro(c: WorkerCapacity) -> AvroDict:
    """Also the JSON the projector stores in `workers` (capacity, free)."""
    return {"cpu": c.cpu, "memory_mb": c.memory_mb, "gpu": c.gpu}


def heartbeat_from_avro(d: AvroDict) -> Heartbeat:
    return Heartbeat(
        d["worker_id"],
        d["at_ms"],
        _capacity_from_avro(d["capacity"]),
        _capacity_from_avro(d["free"]),
        tuple(sorted(d.get("labels", {}).items())),
        tuple(RunningAttempt(r["run_id"], int(r["attempt"])) for r in d.get("running", [])),
        d.get("armed_ms"),
    )


def assignment_to_avro(a: WorkerAssignment) -> AvroDict:
    return {"worker_id": a.worker_id, "at_ms": a.at_ms, "dispatch": dispatch_to_avro(a.dispatch)}


def assignment_from_avro(d: AvroDict) -> WorkerAssignment:
    return WorkerAssignment(d["worker_id"], d["at_ms"], dispatch_from_avro(d["dispatch"]))


WORKER_CLASSES: tuple[type[Any], ...] = (WorkerAssignment, ClaimReply, CancelOrder)


# -- every record class: Avro full name, to dict, from dict --------------------------------
ToAvro: TypeAlias = Callable[[Any], AvroDict]
FromAvro: TypeAlias = Callable[[AvroDict], Any]


def _entry(cls: type[Any], to: ToAvro, back: FromAvro) -> tuple[type[Any], str, ToAvro, FromAvro]:
    return cls, f"{NAMESPACE}.{cls.__name__}", to, back


LEDGER_CLASSES: tuple[type[LedgerInput], ...] = (
    JobUpserted,
    JobPaused,
    JobResumed,
    JobDeleted,
    FireProposed,
    RunNowRequested,
    BackfillRequested,
    CancelRequested,
    RerunRequested,
    ClaimRequested,
    RunStarted,
    RunFinished,
    DeadlineReached,
    WorkerLost,
    DependencyLinked,
    UpstreamFinished,
    DispatchFailed,
    RunReleased,
)

CONVERTERS: dict[type[Any], tuple[str, ToAvro, FromAvro]] = {
    cls: (name, to, back)
    for cls, name, to, back in (
        _entry(JobUpserted, job_upserted_to_avro, job_upserted_from_avro),
        _entry(DependencyLinked, *_flat(DependencyLinked, tuples=("trail",))),
        *(
            _entry(cls, *_flat(cls))
            for cls in LEDGER_CLASSES
            if cls is not JobUpserted and cls is not DependencyLinked
        ),
        _entry(JobState, job_state_to_avro, job_state_from_avro),
        _entry(RunState, run_state_to_avro, run_state_from_avro),
        _entry(RunEvent, *_flat(RunEvent)),
        _entry(JobEvent, job_event_to_avro, job_event_from_avro),
        _entry(DispatchRequest, dispatch_to_avro, dispatch_from_avro),
        _entry(JobSpec, spec_to_avro, spec_from_avro),
        _entry(WorkerAssignment, assignment_to_avro, assignment_from_avro),
        _entry(ClaimReply, *_flat(ClaimReply)),
        _entry(CancelOrder, *_flat(CancelOrder)),
    )
}
