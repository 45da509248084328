"""A job.upsert's spec read field by field (streams/core/commands.py reads the command
around it): id and owner, schedule, argv, env and secret references, resources and labels,
timeout and retry, dependencies, policies, notify, calendars of excluded days, parameters;
and the bounds of a job, where the contract is silent this module's choice. `parse_notify`
reads a notify object alone, by the same rules (the notifier's per-owner routes).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Final
from urllib.parse import urlsplit

from schemas.spec import (
    CONCURRENCY_POLICIES,
    DST_POLICIES,
    MISFIRE_POLICIES,
    NOTIFY_ON,
    Exclusion,
    JobSpec,
    Notify,
    NotifyOn,
    Param,
    Resources,
    RetryPolicy,
    Schedule,
)
from streams.core.command_fields import (
    _array,
    _bool,
    _choice,
    _clip,
    _Doc,
    _identifier,
    _int,
    _Invalid,
    _job_id,
    _kind,
    _list,
    _number,
    _object,
    _only,
    _path,
    _required,
    _show,
    _text,
)
from streams.core.params import ParamError, parse_declarations, written
from streams.core.schedule import ScheduleError, parse_schedule

MAX_OWNER_CHARS: Final = 64
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
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]*", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

_UPSERT_FIELDS = (
    "type", "job_id", "owner", "schedule", "command", "env", "resources", "timeout_s",
    "retry", "idempotent", "depends_on", "misfire", "concurrency", "dst", "jitter_s",
    "priority", "notify", "sla_s", "managed_by", "params", "params_in_command", "exclude",
    "max_runs",
)  # fmt: skip
MAX_EXCLUDED: Final = 400  # day ranges a job's calendars may hold
MAX_RUNS_LIMIT: Final = 1_000_000_000
MANUAL: Final = "manual"  # `schedule: manual`: no schedule, said outright
_NOTIFY_FIELDS = ("url", "on")
_RESOURCE_FIELDS = ("cpu", "memory_mb", "gpu", "labels")
_RETRY_FIELDS = ("max_attempts", "backoff_s", "backoff_multiplier", "max_backoff_s")


def _job_spec(doc: _Doc) -> JobSpec:
    _only(doc, _UPSERT_FIELDS, "")
    job_id = _job_id(_required(doc, "job_id"), "job_id")
    owner = _identifier(_required(doc, "owner"), "owner", MAX_OWNER_CHARS, "owner")
    command = _argv(_required(doc, "command"))
    depends_on = _depends_on(doc.get("depends_on"), job_id)
    # No schedule: with upstreams, a step of a DAG; without, a manual job, run only when
    # asked (run-now, the API).
    schedule = _schedule(doc.get("schedule"))
    idempotent = _bool(doc, "idempotent", False)
    env, secret_env = _env(doc.get("env"))
    sla_s = (
        None if doc.get("sla_s") is None else _number(doc, "sla_s", 0, 0, MAX_SLA_S, positive=True)
    )
    spec = JobSpec(
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
    # Limits hold on what is written: defaults that make the command too large as
    # dispatched would fail every run of the schedule, so the job is refused here, on
    # the API and the topic alike. A parameter without a default is checked with the
    # run-now or backfill that gives it.
    defaults = tuple((p.name, p.default) for p in spec.params if p.default is not None)
    try:
        written(spec, defaults)
    except ParamError as exc:
        raise _Invalid(f"{exc}, with the defaults", exc.field) from None
    return spec


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


def _managed_by(value: object) -> str:
    if value is None or value == "":
        return ""
    return _identifier(value, "managed_by", MAX_OWNER_CHARS, "managed_by")


def _schedule(value: object) -> Schedule:
    if value is None or value == MANUAL:
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
