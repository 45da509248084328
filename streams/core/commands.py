"""Command validation (docs/architecture.md, "Ingress").

Turns untrusted input from the `commands` topic or an API body into typed, frozen command
records, or a `Rejection` naming the offending field. Pure: no Kafka, HTTP or clock.
Nothing here raises on any input; everything wrong becomes a Rejection.

Where the contract is silent the bounds below are this module's choice. The rules:
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

import difflib
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, TypeAlias, TypeVar
from urllib.parse import urlsplit

import orjson

from schemas.spec import (
    CONCURRENCY_POLICIES,
    DST_POLICIES,
    MISFIRE_POLICIES,
    NOTIFY_ON,
    AtSchedule,
    CronSchedule,
    EverySchedule,
    Exclusion,
    JobSpec,
    Notify,
    NotifyOn,
    Param,
    Resources,
    RetryPolicy,
    Schedule,
)
from streams.core.ids import MANUAL, job_of, parse_run_id
from streams.core.params import (
    ParamError,
    ParamValues,
    declarations_document,
    parse_declarations,
    parse_values,
)
from streams.core.schedule import ScheduleError, parse_schedule

MAX_COMMAND_BYTES: Final = 64 * 1024  # encoded size of one command (the API should cap bodies)
MAX_JOB_ID_CHARS: Final = 128
MAX_OWNER_CHARS: Final = 64
MAX_REQUEST_ID_CHARS: Final = 128
MAX_ARGV: Final = 256  # command elements
MAX_ARG_CHARS: Final = 32 * 1024  # one argv element
MAX_ENV_VARS: Final = 256
MAX_ENV_NAME_CHARS: Final = 256
MAX_ENV_VALUE_CHARS: Final = 32 * 1024
MAX_SECRET_NAME_CHARS: Final = 128
RESERVED_ENV_PREFIX: Final = "CRONLOG_"  # set by the worker for every run
MAX_CPU: Final = 1024
MAX_MEMORY_MB: Final = 4_194_304  # 4 TiB
MAX_GPU: Final = 64
MAX_LABELS: Final = 64
MAX_LABEL_KEY_CHARS: Final = 63
MAX_LABEL_VALUE_CHARS: Final = 256
DEFAULT_TIMEOUT_S: Final = 3600.0
MAX_TIMEOUT_S: Final = 7 * 24 * 3600
MAX_ATTEMPTS: Final = 100
DEFAULT_MAX_ATTEMPTS: Final = 1  # not idempotent: never retried unless asked
DEFAULT_IDEMPOTENT_MAX_ATTEMPTS: Final = 3
DEFAULT_BACKOFF_S: Final = 10.0
DEFAULT_BACKOFF_MULTIPLIER: Final = 2.0
DEFAULT_MAX_BACKOFF_S: Final = 600.0  # raised to backoff_s when only backoff_s is larger
MAX_BACKOFF_S: Final = 24 * 3600  # bound of backoff_s and max_backoff_s
MAX_BACKOFF_MULTIPLIER: Final = 10
MAX_DEPENDS_ON: Final = 64
MAX_JITTER_S: Final = 3600
MIN_PRIORITY: Final = -1000
MAX_PRIORITY: Final = 1000
MAX_SLA_S: Final = 7 * 24 * 3600
MAX_URL_CHARS: Final = 2048
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

_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
_ID_RULE = "start with a letter or digit and contain only letters, digits, '.', '_' or '-'"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MANUAL = MANUAL
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_UPSERT_FIELDS = (
    "type", "job_id", "owner", "schedule", "command", "env", "resources", "timeout_s",
    "retry", "idempotent", "depends_on", "misfire", "concurrency", "dst", "jitter_s",
    "priority", "notify", "sla_s", "managed_by", "params", "params_in_command", "exclude",
    "max_runs",
)  # fmt: skip
RESUME_MISSED: Final = ("skip", "last", "all")
MAX_EXCLUDED: Final = 400  # day ranges a job's calendars may hold
MAX_RUNS_LIMIT: Final = 1_000_000_000
_NOTIFY_FIELDS = ("url", "on")
_RESOURCE_FIELDS = ("cpu", "memory_mb", "gpu", "labels")
_RETRY_FIELDS = ("max_attempts", "backoff_s", "backoff_multiplier", "max_backoff_s")


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


class _Invalid(Exception):
    def __init__(self, reason: str, field: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.field = field


_Doc: TypeAlias = dict[str, object]
_T = TypeVar("_T", bound=str)


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


def _job_spec(doc: _Doc) -> JobSpec:
    _only(doc, _UPSERT_FIELDS, "")
    job_id = _job_id(_required(doc, "job_id"), "job_id")
    owner = _identifier(_required(doc, "owner"), "owner", MAX_OWNER_CHARS, "owner")
    command = _argv(_required(doc, "command"))
    depends_on = _depends_on(doc.get("depends_on"), job_id)
    schedule = _schedule(doc.get("schedule"))
    if schedule is None and not depends_on:
        raise _Invalid(
            "schedule is required unless depends_on names an upstream job "
            "(a job with neither would never run)",
            "schedule",
        )
    idempotent = _bool(doc, "idempotent", False)
    env, secret_env = _env(doc.get("env"))
    sla_s = (
        None if doc.get("sla_s") is None else _number(doc, "sla_s", 0, 0, MAX_SLA_S, positive=True)
    )
    return JobSpec(
        job_id=job_id,
        owner=owner,
        schedule=schedule,
        command=command,
        env=env,
        secret_env=secret_env,
        resources=_resources(doc.get("resources")),
        timeout_s=_number(doc, "timeout_s", DEFAULT_TIMEOUT_S, 0, MAX_TIMEOUT_S, positive=True),
        retry=_retry(doc.get("retry"), idempotent),
        idempotent=idempotent,
        depends_on=depends_on,
        misfire=_choice(doc, "misfire", MISFIRE_POLICIES, "run_once"),
        concurrency=_choice(doc, "concurrency", CONCURRENCY_POLICIES, "allow"),
        dst=_choice(doc, "dst", DST_POLICIES, "auto"),
        jitter_s=_number(doc, "jitter_s", 0.0, 0, MAX_JITTER_S),
        priority=_int(doc, "priority", 0, MIN_PRIORITY, MAX_PRIORITY),
        notify=_notify(doc.get("notify"), sla_s),
        sla_s=sla_s,
        managed_by=_managed_by(doc.get("managed_by")),
        params=_params(doc.get("params")),
        params_in_command=_bool(doc, "params_in_command", False),
        exclude=_exclude(doc.get("exclude")),
        max_runs=None
        if doc.get("max_runs") is None
        else _int(doc, "max_runs", 1, 1, MAX_RUNS_LIMIT),
    )


def _exclude(value: object) -> tuple[Exclusion, ...]:
    """`exclude`: [{"name": calendar, "dates": ["2026-12-25", "2026-12-24..2026-12-26"]}]:
    days (in the schedule's zone) it does not run."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _Invalid("exclude must be a list of {name, dates}", "exclude")
    found: list[Exclusion] = []
    for index, group in enumerate(value):
        path = f"exclude[{index}]"
        if not isinstance(group, dict) or not set(group) <= {"name", "dates"}:
            raise _Invalid(f"{path} must be an object with dates and, optionally, name", path)
        name = group.get("name", "exclude")
        name = _identifier(name, f"{path}.name", MAX_OWNER_CHARS, f"{path}.name")
        dates = group.get("dates")
        if not isinstance(dates, list) or not dates:
            raise _Invalid(f"{path}.dates must be a non-empty list of days or day ranges", path)
        for day in dates:
            first, last = _day_range(day, f"{path}.dates")
            found.append(Exclusion(name, first, last))
    if len(found) > MAX_EXCLUDED:
        raise _Invalid(f"exclude holds {len(found)} day ranges; at most {MAX_EXCLUDED}", "exclude")
    return tuple(found)


def _day_range(value: object, path: str) -> tuple[str, str]:
    """'YYYY-MM-DD' or 'YYYY-MM-DD..YYYY-MM-DD' (inclusive, first <= last)."""
    if not isinstance(value, str):
        raise _Invalid(f"{path}: a day is 'YYYY-MM-DD' or 'YYYY-MM-DD..YYYY-MM-DD'", path)
    first, _, last = value.partition("..")
    last = last or first
    for day in (first, last):
        try:
            parsed = datetime.strptime(day, "%Y-%m-%d")
        except ValueError:
            raise _Invalid(
                f"{path}: {_show(value)} is not a day such as 2026-12-25", path
            ) from None
        if parsed.strftime("%Y-%m-%d") != day:
            raise _Invalid(f"{path}: {_show(value)} is not a day such as 2026-12-25", path)
    if first > last:
        raise _Invalid(f"{path}: {_show(value)} ends before it starts", path)
    return first, last


def _params(value: object) -> tuple[Param, ...]:
    try:
        return parse_declarations(value)
    except ParamError as exc:
        raise _Invalid(str(exc), exc.field) from None


def _param_values(doc: _Doc) -> ParamValues:
    try:
        return parse_values(doc.get("params"))
    except ParamError as exc:
        raise _Invalid(str(exc), exc.field) from None


def _managed_by(value: object) -> str:
    if value is None or value == "":
        return ""
    return _identifier(value, "managed_by", MAX_OWNER_CHARS, "managed_by")


def _schedule(value: object) -> Schedule:
    if value is None:
        return None
    try:
        return parse_schedule(value)
    except ScheduleError as exc:
        message = _clip(str(exc))
        reason = message if message.startswith("schedule") else f"schedule: {message}"
        raise _Invalid(reason, "schedule") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # defence in depth
        raise _Invalid(f"schedule is invalid: {_clip(str(exc))}", "schedule") from None


def _argv(value: object) -> tuple[str, ...]:
    items = _array(value, "command", MAX_ARGV)
    if not items:
        raise _Invalid("command must be a non-empty list of strings (argv)", "command")
    for index, item in enumerate(items):
        _text(item, f"command[{index}]", MAX_ARG_CHARS)
    if not items[0]:
        raise _Invalid("command[0] (the program) must not be empty", "command[0]")
    return tuple(str(item) for item in items)


def _env(value: object) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    """Plain values, and references `{"secret": NAME}` the worker resolves (a secret's
    value never travels with the job)."""
    doc = _object(value, "env", MAX_ENV_VARS)
    plain: list[tuple[str, str]] = []
    secret: list[tuple[str, str]] = []
    for name, item in doc.items():
        if len(name) > MAX_ENV_NAME_CHARS or not _ENV_NAME.fullmatch(name):
            raise _Invalid(
                f"env names must match [A-Za-z_][A-Za-z0-9_]* (at most {MAX_ENV_NAME_CHARS} "
                f"characters), got {_show(name)}",
                "env",
            )
        if name.startswith(RESERVED_ENV_PREFIX):
            reason = f"env.{name}: names starting with {RESERVED_ENV_PREFIX} are reserved"
            raise _Invalid(reason, f"env.{name}")
        if isinstance(item, dict):
            _only(item, ("secret",), f"env.{name}")
            ref = _identifier(
                item.get("secret"), f"env.{name}.secret", MAX_SECRET_NAME_CHARS,
                f"env.{name}.secret (a secret's name)",
            )  # fmt: skip
            secret.append((name, ref))
            continue
        plain.append((name, _text(item, f"env.{name}", MAX_ENV_VALUE_CHARS)))
    return tuple(sorted(plain)), tuple(sorted(secret))


def _resources(value: object) -> Resources:
    doc = _object(value, "resources", len(_RESOURCE_FIELDS))
    _only(doc, _RESOURCE_FIELDS, "resources")
    return Resources(
        cpu=_number(doc, "cpu", 0.0, 0, MAX_CPU, prefix="resources"),
        memory_mb=_int(doc, "memory_mb", 0, 0, MAX_MEMORY_MB, prefix="resources"),
        gpu=_int(doc, "gpu", 0, 0, MAX_GPU, prefix="resources"),
        labels=_labels(doc.get("labels")),
    )


def _labels(value: object) -> tuple[tuple[str, str], ...]:
    doc = _object(value, "resources.labels", MAX_LABELS)
    for key, item in doc.items():
        if len(key) > MAX_LABEL_KEY_CHARS or not _LABEL_KEY.fullmatch(key):
            raise _Invalid(
                "resources.labels keys must start with a letter or digit and contain only "
                f"letters, digits, '.', '_', '/' or '-' (at most {MAX_LABEL_KEY_CHARS} "
                f"characters), got {_show(key)}",
                "resources.labels",
            )
        path = f"resources.labels.{key}"
        if _CONTROL.search(_text(item, path, MAX_LABEL_VALUE_CHARS)):
            raise _Invalid(f"{path} must not contain control characters", path)
    return tuple(sorted((key, str(item)) for key, item in doc.items()))


def _retry(value: object, idempotent: bool) -> RetryPolicy:
    doc = _object(value, "retry", len(_RETRY_FIELDS))
    _only(doc, _RETRY_FIELDS, "retry")
    attempts = DEFAULT_IDEMPOTENT_MAX_ATTEMPTS if idempotent else DEFAULT_MAX_ATTEMPTS
    backoff = _number(doc, "backoff_s", DEFAULT_BACKOFF_S, 0, MAX_BACKOFF_S, prefix="retry")
    max_backoff = max(DEFAULT_MAX_BACKOFF_S, backoff)
    retry = RetryPolicy(
        max_attempts=_int(doc, "max_attempts", attempts, 1, MAX_ATTEMPTS, prefix="retry"),
        backoff_s=backoff,
        backoff_multiplier=_number(
            doc,
            "backoff_multiplier",
            DEFAULT_BACKOFF_MULTIPLIER,
            1,
            MAX_BACKOFF_MULTIPLIER,
            prefix="retry",
        ),
        max_backoff_s=_number(doc, "max_backoff_s", max_backoff, 0, MAX_BACKOFF_S, prefix="retry"),
    )
    if retry.max_backoff_s < retry.backoff_s:
        raise _Invalid(
            f"retry.max_backoff_s must be >= retry.backoff_s ({_show(retry.backoff_s)}), "
            f"got {_show(retry.max_backoff_s)}",
            "retry.max_backoff_s",
        )
    return retry


def parse_notify(value: object) -> Notify:
    """A `notify` object outside a job (the notifier's per-owner routes): the same rules,
    `late` allowed (it applies to the jobs that have an sla_s). Raises ValueError."""
    try:
        notify = _notify(value, sla_s=None, late_needs_sla=False)
    except _Invalid as exc:
        raise ValueError(exc.reason) from None
    if notify is None:
        raise ValueError("notify must be an object with url and on")
    return notify


def _notify(value: object, sla_s: float | None, late_needs_sla: bool = True) -> Notify | None:
    """`{"url": "https://...", "on": ["failed", ...]}`: an http(s) URL with a host, and a
    non-empty list of distinct events; `late` needs the job's sla_s."""
    if value is None:
        return None
    doc = _object(value, "notify", 16)  # more than its fields: _only names a stray one
    _only(doc, _NOTIFY_FIELDS, "notify")
    url = _text(_required_in(doc, "url", "notify"), "notify.url", MAX_URL_CHARS)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or _CONTROL.search(url):
        raise _Invalid(
            f"notify.url must be an http:// or https:// URL with a host, got {_show(url)}",
            "notify.url",
        )
    items = _array(_required_in(doc, "on", "notify"), "notify.on", len(NOTIFY_ON))
    on: list[NotifyOn] = []
    for item in items:
        choice = next((o for o in NOTIFY_ON if isinstance(item, str) and item == o), None)
        if choice is None:
            shown = _show(item) if isinstance(item, str) else _kind(item)
            raise _Invalid(
                f"notify.on must list some of {_list(NOTIFY_ON)}, got {shown}", "notify.on"
            )
        if choice in on:
            raise _Invalid(f"notify.on lists {_show(choice)} twice", "notify.on")
        on.append(choice)
    if not on:
        raise _Invalid(f"notify.on must list at least one of {_list(NOTIFY_ON)}", "notify.on")
    if "late" in on and sla_s is None and late_needs_sla:
        raise _Invalid("notify.on has 'late' but the job has no sla_s (seconds)", "notify.on")
    return Notify(url, tuple(on))


def _required_in(doc: _Doc, key: str, prefix: str) -> object:
    value = doc.get(key)
    if value is None:
        path = _path(prefix, key)
        raise _Invalid(f"missing required field {_show(path)}", path)
    return value


def _depends_on(value: object, job_id: str) -> tuple[str, ...]:
    items = _array(value, "depends_on", MAX_DEPENDS_ON)
    seen: set[str] = set()
    for index, item in enumerate(items):
        path = f"depends_on[{index}]"
        upstream = _job_id(item, path)
        if upstream == job_id:
            raise _Invalid(f"{path}: a job cannot depend on itself ({_show(job_id)})", path)
        if upstream in seen:
            raise _Invalid(f"{path}: {_show(upstream)} is listed twice", path)
        seen.add(upstream)
    return tuple(sorted(seen))


# --- field readers ------------------------------------------------------------------------


def _required(doc: _Doc, key: str) -> object:
    value = doc.get(key)
    if value is None:
        raise _Invalid(f"missing required field '{key}'", key)
    return value


def _only(doc: _Doc, allowed: tuple[str, ...], prefix: str) -> None:
    for key in doc:
        if not isinstance(key, str):
            raise _Invalid(f"field names must be strings, got {_kind(key)}", prefix or None)
        if key not in allowed:
            close = difflib.get_close_matches(key[:64], allowed, n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            path = _path(prefix, key)
            raise _Invalid(
                f"unknown field {_show(path)}; {hint}expected one of {_list(allowed)}", path
            )


def _object(value: object, path: str, max_items: int) -> _Doc:
    """An optional JSON object (None: empty) with string keys and at most max_items entries."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Invalid(f"{path} must be an object, got {_kind(value)}", path)
    if len(value) > max_items:
        raise _Invalid(f"{path} must have at most {max_items} entries, got {len(value)}", path)
    for key in value:
        if not isinstance(key, str):
            raise _Invalid(f"{path} keys must be strings, got {_kind(key)}", path)
    return value


def _array(value: object, path: str, max_items: int) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list | tuple):
        raise _Invalid(f"{path} must be a list, got {_kind(value)}", path)
    if len(value) > max_items:
        raise _Invalid(f"{path} must have at most {max_items} elements, got {len(value)}", path)
    return list(value)


def _text(value: object, path: str, max_chars: int) -> str:
    """A string without NUL characters that encodes as UTF-8."""
    if not isinstance(value, str):
        raise _Invalid(f"{path} must be a string, got {_kind(value)}", path)
    if len(value) > max_chars:
        raise _Invalid(f"{path} must be at most {max_chars} characters, got {len(value)}", path)
    if "\x00" in value:
        raise _Invalid(f"{path} must not contain NUL characters", path)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Invalid(f"{path} is not valid Unicode text", path) from None
    return value


def _identifier(value: object, path: str, max_chars: int, what: str) -> str:
    if not isinstance(value, str):
        raise _Invalid(f"{what} must be a string, got {_kind(value)}", path)
    if not 1 <= len(value) <= max_chars:
        raise _Invalid(f"{what} must be 1 to {max_chars} characters, got {len(value)}", path)
    if not _ID.fullmatch(value):
        raise _Invalid(f"{what} must {_ID_RULE}, got {_show(value)}", path)
    return value


def _job_id(value: object, path: str) -> str:
    return _identifier(value, path, MAX_JOB_ID_CHARS, path)


def _request_id(doc: _Doc) -> str:
    return _identifier(
        _required(doc, "request_id"), "request_id", MAX_REQUEST_ID_CHARS, "request_id"
    )


def _bool(doc: _Doc, key: str, default: bool) -> bool:
    value = doc.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _Invalid(f"{key} must be true or false, got {_kind(value)}", key)
    return value


def _int(doc: _Doc, key: str, default: int, lo: int, hi: int, *, prefix: str = "") -> int:
    path, value = _path(prefix, key), doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(f"{path} must be an integer, got {_kind(value)}", path)
    _bounds(path, value, lo, hi)
    return value


def _number(
    doc: _Doc,
    key: str,
    default: float,
    lo: int,
    hi: int,
    *,
    prefix: str = "",
    positive: bool = False,
) -> float:
    path, value = _path(prefix, key), doc.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _Invalid(f"{path} must be a number, got {_kind(value)}", path)
    if not math.isfinite(value):
        raise _Invalid(f"{path} must be a finite number, got {_show(value)}", path)
    if positive and value <= 0:
        raise _Invalid(f"{path} must be > 0, got {_show(value)}", path)
    _bounds(path, value, lo, hi)
    return float(value)


def _bounds(path: str, value: float, lo: int, hi: int) -> None:
    if value < lo:
        raise _Invalid(f"{path} must be >= {lo}, got {_show(value)}", path)
    if value > hi:
        raise _Invalid(f"{path} must be <= {hi}, got {_show(value)}", path)


def _choice(doc: _Doc, key: str, options: tuple[_T, ...], default: _T) -> _T:
    value = doc.get(key)
    if value is None:
        return default
    for option in options:
        if value == option and isinstance(value, str):
            return option
    shown = _show(value) if isinstance(value, str) else _kind(value)
    raise _Invalid(f"{key} must be one of {_list(options)}, got {shown}", key)


# --- messages -----------------------------------------------------------------------------


def _path(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _list(options: tuple[str, ...]) -> str:
    return ", ".join(options)


def _kind(value: object) -> str:
    """The JSON name of a value's type."""
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    names |= {list: "array", tuple: "array", dict: "object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _clip(message: str, limit: int = 300) -> str:
    return message if len(message) <= limit else message[:limit] + "…"


def _show(value: object) -> str:
    """A short repr of a scalar for messages (reasons land in the DLQ: keep them bounded)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return "a very large integer"
    if not isinstance(value, str | int | float | bool | None):
        return _kind(value)
    return repr(value[:80] + "…" if isinstance(value, str) and len(value) > 80 else value)
