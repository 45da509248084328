"""Command validation (docs/architecture.md, "Ingress").

Turns untrusted input from the `commands` topic or an API body into typed, frozen command
records, or a `Rejection` naming the offending field. Pure: no Kafka, HTTP or clock.
Nothing here raises on any input; everything wrong becomes a Rejection.

Where the contract is silent the bounds are this module's choice: a command's here, a
job's in streams/core/command_spec.py (which reads a job.upsert's spec), an id's in
streams/core/command_fields.py (the field readers both use). The rules:
- unknown fields are rejected at every level (a typo such as `timout_s` must not be ignored);
  `null` for an optional field means "absent" (its default);
- booleans are not numbers; integer fields take JSON integers only; float fields take
  integers or finite floats;
- ids (job, owner, request) are ASCII `[A-Za-z0-9][A-Za-z0-9._-]*`, so never contain `@`
  (run ids use it) or spaces;
- env and labels are normalised to sorted tuples of pairs, depends_on to a sorted tuple,
  command (argv) to a tuple;
- run ids are `{job_id}@{ISO-8601 UTC}` (as `ids.iso_utc` renders it) or
  `{job_id}@manual:{request_id}`; the job id is the part before the first `@`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeAlias

import orjson

from schemas.spec import AtSchedule, CronSchedule, EverySchedule, JobSpec, Schedule
from streams.core.command_fields import (
    MAX_JOB_ID_CHARS,
    MAX_REQUEST_ID_CHARS,
    _choice,
    _Doc,
    _identifier,
    _Invalid,
    _job_id,
    _kind,
    _list,
    _only,
    _request_id,
    _required,
    _show,
    _text,
)
from streams.core.command_spec import _job_spec
from streams.core.ids import MANUAL, job_of, parse_run_id
from streams.core.params import ParamError, ParamValues, declarations_document, parse_values

MAX_COMMAND_BYTES: Final = 64 * 1024  # encoded size of one command (the API should cap bodies)
MAX_BACKFILL_SPAN_MS: Final = 366 * 24 * 3600 * 1000
# Runs one backfill may create (the ledger makes them 1,000 a transaction; the API refuses
# a range holding more, naming the count).
MAX_BACKFILL_RUNS: Final = 100_000
# Backfill bounds: nothing is scheduled before the epoch, and run ids render the time in
# UTC with a 4-digit year.
MIN_INSTANT_MS: Final = 0  # 1970-01-01T00:00:00Z
MAX_INSTANT_MS: Final = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z

COMMAND_TYPES: Final = (
    "job.upsert",
    "job.pause",
    "job.resume",
    "job.delete",
    "job.run_now",
    "job.backfill",
    "run.cancel",
    "run.rerun",
)

_MANUAL = MANUAL
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

RESUME_MISSED: Final = ("skip", "last", "all")


@dataclass(frozen=True, slots=True)
class UpsertJob:
    spec: JobSpec


@dataclass(frozen=True, slots=True)
class PauseJob:
    job_id: str


@dataclass(frozen=True, slots=True)
class ResumeJob:
    job_id: str
    missed: str = "skip"  # the firings the pause covered: skip, run the last, or all


@dataclass(frozen=True, slots=True)
class DeleteJob:
    job_id: str


@dataclass(frozen=True, slots=True)
class RunNow:
    job_id: str
    request_id: str
    params: ParamValues = ()  # values given, checked against the job's declaration later


@dataclass(frozen=True, slots=True)
class Backfill:
    job_id: str
    from_ms: int  # inclusive lower bound, UTC epoch milliseconds
    to_ms: int  # upper bound, UTC epoch milliseconds; from_ms < to_ms
    request_id: str = ""  # optional: a repeated request is refused, not applied twice
    params: ParamValues = ()  # values given to every run it creates


@dataclass(frozen=True, slots=True)
class CancelRun:
    run_id: str
    job_id: str  # the part of run_id before its first '@'


@dataclass(frozen=True, slots=True)
class RerunRun:
    run_id: str
    job_id: str
    request_id: str


Command: TypeAlias = (
    UpsertJob | PauseJob | ResumeJob | DeleteJob | RunNow | Backfill | CancelRun | RerunRun
)


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str  # human readable, names the field
    field: str | None  # dotted path of the offending field, when there is one


def parse_command(raw: bytes | None) -> Command | Rejection:
    """Size check, then JSON decoding, then `validate_command`."""
    if raw is None:
        return Rejection("command has no value (a tombstone)", None)
    if not isinstance(raw, bytes | bytearray | memoryview):
        return Rejection(f"command must be bytes, got {type(raw).__name__}", None)
    if len(raw) > MAX_COMMAND_BYTES:
        return Rejection(f"command is {len(raw)} bytes; at most {MAX_COMMAND_BYTES} allowed", None)
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Rejection(f"command is not valid JSON: {exc}", None)
    return validate_command(doc)


def validate_command(doc: object) -> Command | Rejection:
    """Validate an already decoded JSON value."""
    try:
        return _command(doc)
    except _Invalid as invalid:
        return Rejection(invalid.reason, invalid.field)


def command_job_id(cmd: Command) -> str:
    """The Kafka key of a command: the job it is about."""
    if isinstance(cmd, UpsertJob):
        return cmd.spec.job_id
    return cmd.job_id


# --- the inverse: a spec as the command that makes it -------------------------------------

_EVERY_UNITS: Final = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000))


def upsert_document(spec: JobSpec) -> dict[str, Any]:
    """The job.upsert command, as JSON values, that this module parses back into exactly
    `spec`: ``parse_command(orjson.dumps(upsert_document(spec))) == UpsertJob(spec)`` for
    every spec the parser can produce. The one way a stored spec (a JobSpec, or its JSON
    view in the projection, via `schemas.json.from_plain`) becomes a command again.

    Every field is written out, none left to a default, so the command means the same
    job whatever the defaults become; `dst` is passed through as it is. Raises ValueError
    for a schedule no command can express (see `schedule_document`)."""
    doc: dict[str, Any] = {"type": "job.upsert", "job_id": spec.job_id, "owner": spec.owner}
    schedule = schedule_document(spec.schedule)
    if schedule is not None:  # absent: a DAG step, run when its upstreams succeeded
        doc["schedule"] = schedule
    resources, retry = spec.resources, spec.retry
    doc |= {
        "command": list(spec.command),
        "env": {**dict(spec.env), **{k: {"secret": v} for k, v in spec.secret_env}},
        "resources": {
            "cpu": resources.cpu,
            "memory_mb": resources.memory_mb,
            "gpu": resources.gpu,
            "labels": dict(resources.labels),
        },
        "timeout_s": spec.timeout_s,
        "retry": {
            "max_attempts": retry.max_attempts,
            "backoff_s": retry.backoff_s,
            "backoff_multiplier": retry.backoff_multiplier,
            "max_backoff_s": retry.max_backoff_s,
        },
        "idempotent": spec.idempotent,
        "depends_on": list(spec.depends_on),
        "misfire": spec.misfire,
        "concurrency": spec.concurrency,
        "dst": spec.dst,
        "jitter_s": spec.jitter_s,
        "priority": spec.priority,
        "notify": None
        if spec.notify is None
        else {"url": spec.notify.url, "on": list(spec.notify.on)},
        "sla_s": spec.sla_s,
    }
    if spec.managed_by:
        doc["managed_by"] = spec.managed_by
    if spec.params:
        doc["params"] = declarations_document(spec.params)
    if spec.params_in_command:
        doc["params_in_command"] = True
    if spec.exclude:
        by_name: dict[str, list[str]] = {}
        for e in spec.exclude:
            by_name.setdefault(e.name, []).append(
                e.first if e.first == e.last else f"{e.first}..{e.last}"
            )
        doc["exclude"] = [{"name": n, "dates": d} for n, d in by_name.items()]
    if spec.max_runs is not None:
        doc["max_runs"] = spec.max_runs
    return doc


def _iso(ms: int) -> str:
    try:
        moment = _EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        raise ValueError(f"{ms} ms is outside the years 1 to 9999") from None
    spec = "milliseconds" if ms % 1000 else "seconds"
    return moment.replace(tzinfo=None).isoformat(timespec=spec) + "Z"


def _window(schedule: CronSchedule | EverySchedule) -> dict[str, str]:
    bounds = {}
    if schedule.start_ms is not None:
        bounds["start"] = _iso(schedule.start_ms)
    if schedule.end_ms is not None:
        bounds["end"] = _iso(schedule.end_ms)
    return bounds


def schedule_document(schedule: Schedule) -> dict[str, str] | None:
    """The `schedule` value of a command that `parse_schedule` turns into `schedule`
    (None: no schedule). An interval is written in its largest whole unit ("90s",
    "2h"), a one-off as ISO-8601 UTC with a Z (milliseconds when not zero). Raises
    ValueError for an interval that is not a positive whole number of seconds or a
    one-off outside the years 1 to 9999."""
    if schedule is None:
        return None
    if isinstance(schedule, CronSchedule):
        return {"cron": schedule.expr, "timezone": schedule.timezone, **_window(schedule)}
    if isinstance(schedule, EverySchedule):
        every_ms = schedule.every_ms
        for unit, unit_ms in _EVERY_UNITS:
            if every_ms > 0 and every_ms % unit_ms == 0:
                return {"every": f"{every_ms // unit_ms}{unit}", **_window(schedule)}
        raise ValueError(f"every_ms {every_ms} is not a positive whole number of seconds")
    if isinstance(schedule, AtSchedule):
        try:
            moment = _EPOCH + timedelta(milliseconds=schedule.at_ms)
        except OverflowError:
            raise ValueError(f"at_ms {schedule.at_ms} is outside the years 1 to 9999") from None
        spec = "milliseconds" if schedule.at_ms % 1000 else "seconds"
        return {"at": moment.replace(tzinfo=None).isoformat(timespec=spec) + "Z"}
    raise TypeError(f"not a schedule: {type(schedule).__name__}")


def _command(doc: object) -> Command:
    if not isinstance(doc, dict):
        raise _Invalid(f"command must be a JSON object, got {_kind(doc)}", None)
    kind = doc.get("type")
    if kind is None:
        raise _Invalid(
            f"missing required field 'type'; expected one of {_list(COMMAND_TYPES)}", "type"
        )
    if not isinstance(kind, str) or kind not in COMMAND_TYPES:
        shown = _show(kind) if isinstance(kind, str) else _kind(kind)
        raise _Invalid(
            f"unknown command type {shown}; expected one of {_list(COMMAND_TYPES)}", "type"
        )
    if kind == "job.upsert":
        return UpsertJob(_job_spec(doc))
    if kind in ("run.cancel", "run.rerun"):
        return _run_command(doc, kind)
    return _job_command(doc, kind)


def _job_command(doc: _Doc, kind: str) -> Command:
    if kind == "job.run_now":
        _only(doc, ("type", "job_id", "request_id", "params"), "")
        job_id = _job_id(_required(doc, "job_id"), "job_id")
        return RunNow(job_id, _request_id(doc), _param_values(doc))
    if kind == "job.backfill":
        _only(doc, ("type", "job_id", "from", "to", "request_id", "params"), "")
        job_id = _job_id(_required(doc, "job_id"), "job_id")
        from_ms, to_ms = _instant(doc, "from"), _instant(doc, "to")
        if from_ms >= to_ms:
            raise _Invalid("backfill 'from' must be before 'to'", "from")
        if to_ms - from_ms > MAX_BACKFILL_SPAN_MS:
            days = MAX_BACKFILL_SPAN_MS // 86_400_000
            raise _Invalid(f"backfill span from 'from' to 'to' must be at most {days} days", "to")
        request_id = _request_id(doc) if "request_id" in doc else ""
        return Backfill(job_id, from_ms, to_ms, request_id, _param_values(doc))
    if kind == "job.resume":
        _only(doc, ("type", "job_id", "missed"), "")
        job_id = _job_id(_required(doc, "job_id"), "job_id")
        return ResumeJob(job_id, _choice(doc, "missed", RESUME_MISSED, "skip"))
    _only(doc, ("type", "job_id"), "")
    job_id = _job_id(_required(doc, "job_id"), "job_id")
    if kind == "job.pause":
        return PauseJob(job_id)
    return DeleteJob(job_id)


def _run_command(doc: _Doc, kind: str) -> Command:
    if kind == "run.cancel":
        _only(doc, ("type", "run_id"), "")
        return CancelRun(*_run_id(_required(doc, "run_id")))
    _only(doc, ("type", "run_id", "request_id"), "")
    run_id, job_id = _run_id(_required(doc, "run_id"))
    return RerunRun(run_id, job_id, _request_id(doc))


def _run_id(value: object) -> tuple[str, str]:
    """(run_id, job_id) of a well-formed run id."""
    run_id = _text(value, "run_id", MAX_JOB_ID_CHARS + 1 + len(_MANUAL) + MAX_REQUEST_ID_CHARS)
    shape = "run_id must be '{job_id}@{ISO-8601 UTC time}' or '{job_id}@manual:{request_id}'"
    if "@" not in run_id:
        raise _Invalid(f"{shape}, got {_show(run_id)}", "run_id")
    _identifier(job_of(run_id), "run_id", MAX_JOB_ID_CHARS, "the job id in run_id")
    parts = parse_run_id(run_id)
    if parts is None:
        raise _Invalid(f"{shape}, got {_show(run_id)}", "run_id")
    if parts.request_id is not None:
        _identifier(parts.request_id, "run_id", MAX_REQUEST_ID_CHARS, "the request id in run_id")
    return run_id, parts.job_id


def _instant(doc: _Doc, key: str) -> int:
    """An ISO-8601 time with an explicit offset or Z, as epoch ms (sub-ms digits dropped)."""
    value = _required(doc, key)
    if not isinstance(value, str):
        raise _Invalid(f"{key} must be an ISO-8601 time string, got {_kind(value)}", key)
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _Invalid(f"{key} must be an ISO-8601 time, got {_show(value)}", key) from None
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise _Invalid(f"{key} must have an explicit offset or Z, got {_show(value)}", key)
    ms: int = (moment - _EPOCH) // timedelta(milliseconds=1)
    if not MIN_INSTANT_MS <= ms <= MAX_INSTANT_MS:
        raise _Invalid(f"{key} must be in 1970-01-01 to 9999-12-31 UTC, got {_show(value)}", key)
    return ms


def _param_values(doc: _Doc) -> ParamValues:
    try:
        return parse_values(doc.get("params"))
    except ParamError as exc:
        raise _Invalid(str(exc), exc.field) from None
