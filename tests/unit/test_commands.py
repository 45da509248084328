"""Command validation (streams/core/commands.py): every rule, the contract's example,
defaults, and properties over arbitrary input (nothing raises; valid documents parse)."""

from __future__ import annotations

import copy
import dataclasses
import math
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas.spec import (
    CONCURRENCY_POLICIES,
    DST_POLICIES,
    MISFIRE_POLICIES,
    CronSchedule,
    JobSpec,
    Resources,
    RetryPolicy,
)
from streams.core.commands import (
    COMMAND_TYPES,
    MAX_BACKFILL_SPAN_MS,
    MAX_COMMAND_BYTES,
    Backfill,
    CancelRun,
    Command,
    DeleteJob,
    PauseJob,
    Rejection,
    RerunRun,
    ResumeJob,
    RunNow,
    UpsertJob,
    command_job_id,
    parse_command,
    upsert_document,
    validate_command,
)
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.schedule import parse_schedule

# The README's job.upsert example, verbatim.
DESIGN_EXAMPLE = b"""
{"type": "job.upsert", "job_id": "nightly-etl", "owner": "team-a",
 "schedule": {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
 "command": ["python", "etl.py", "--full"], "env": {"MODE": "prod"},
 "resources": {"cpu": 0.5, "memory_mb": 256, "gpu": 0, "labels": {"zone": "a"}},
 "timeout_s": 600,
 "retry": {"max_attempts": 3, "backoff_s": 10, "backoff_multiplier": 2, "max_backoff_s": 600},
 "idempotent": true, "depends_on": ["extract"], "misfire": "run_once",
 "concurrency": "allow", "dst": "run_once", "jitter_s": 0, "priority": 0}
"""
EVERY_30S = {"every": "30s"}
MINIMAL: dict[str, Any] = {
    "type": "job.upsert",
    "job_id": "j1",
    "owner": "team-a",
    "schedule": EVERY_30S,
    "command": ["true"],
}
DELETE = object()  # marks a key to remove in `upsert_with`
T0 = "2026-01-01T00:00:00Z"
T0_MS = 1_767_225_600_000


def upsert_with(**changes: object) -> dict[str, Any]:
    """MINIMAL with top-level changes; dotted keys ("resources__cpu") reach one level down."""
    doc = copy.deepcopy(MINIMAL)
    for key, value in changes.items():
        target, name = doc, key
        if "__" in key:
            outer, name = key.split("__")
            target = doc.setdefault(outer, {})
        if value is DELETE:
            target.pop(name, None)
        else:
            target[name] = value
    return doc


def rejected(doc: object) -> Rejection:
    result = validate_command(doc)
    assert isinstance(result, Rejection), result
    return result


def accepted(doc: object) -> Command:
    result = validate_command(doc)
    assert not isinstance(result, Rejection), result
    return result


def spec_of(doc: object) -> JobSpec:
    result = accepted(doc)
    assert isinstance(result, UpsertJob)
    return result.spec


# --- the contract's example and defaults --------------------------------------------------


def test_the_design_example_parses_into_the_expected_spec() -> None:
    result = parse_command(DESIGN_EXAMPLE)
    schedule = parse_schedule({"cron": "0 2 * * *", "timezone": "Europe/Berlin"})
    assert isinstance(schedule, CronSchedule)
    assert result == UpsertJob(
        JobSpec(
            job_id="nightly-etl",
            owner="team-a",
            schedule=schedule,
            command=("python", "etl.py", "--full"),
            env=(("MODE", "prod"),),
            resources=Resources(cpu=0.5, memory_mb=256, gpu=0, labels=(("zone", "a"),)),
            timeout_s=600.0,
            retry=RetryPolicy(
                max_attempts=3, backoff_s=10, backoff_multiplier=2, max_backoff_s=600
            ),
            idempotent=True,
            depends_on=("extract",),
            misfire="run_once",
            concurrency="allow",
            dst="run_once",
            jitter_s=0.0,
            priority=0,
        )
    )
    assert isinstance(result, UpsertJob)
    assert command_job_id(result) == "nightly-etl"
    assert isinstance(result.spec.timeout_s, float)
    assert isinstance(result.spec.resources.cpu, float)


def test_defaults_of_a_minimal_upsert() -> None:
    spec = spec_of(MINIMAL)
    assert spec == JobSpec(
        job_id="j1",
        owner="team-a",
        schedule=parse_schedule(EVERY_30S),
        command=("true",),
        env=(),
        resources=Resources(cpu=0.0, memory_mb=0, gpu=0, labels=()),
        timeout_s=3600.0,
        retry=RetryPolicy(
            max_attempts=1, backoff_s=10.0, backoff_multiplier=2.0, max_backoff_s=600
        ),
        idempotent=False,
        depends_on=(),
        misfire="run_once",
        concurrency="allow",
        dst="auto",
        jitter_s=0.0,
        priority=0,
    )


def test_an_idempotent_job_retries_three_times_by_default() -> None:
    assert spec_of(upsert_with(idempotent=True)).retry == RetryPolicy(max_attempts=3)
    assert spec_of(upsert_with(idempotent=True, retry={"backoff_s": 5})).retry == RetryPolicy(
        max_attempts=3, backoff_s=5.0
    )
    assert spec_of(upsert_with(idempotent=False, retry={})).retry.max_attempts == 1
    assert spec_of(upsert_with(retry={"max_attempts": 4})).retry.max_attempts == 4


def test_a_large_backoff_raises_the_default_max_backoff_with_it() -> None:
    retry = spec_of(upsert_with(retry={"backoff_s": 900})).retry
    assert (retry.backoff_s, retry.max_backoff_s) == (900.0, 900.0)


def test_null_optional_fields_take_their_defaults() -> None:
    nulls = dict.fromkeys(["env", "resources", "timeout_s", "retry", "idempotent", "misfire"])
    assert spec_of(upsert_with(**nulls, jitter_s=None, priority=None)) == spec_of(MINIMAL)


def test_env_labels_command_and_depends_on_are_normalised() -> None:
    spec = spec_of(
        upsert_with(
            env={"B": "2", "A": "1", "_C": ""},
            resources={"labels": {"zone": "b", "arch": "arm64", "k8s.io/x": ""}},
            command=["sh", "-c", "", "echo hi"],
            depends_on=["zeta", "alpha"],
        )
    )
    assert spec.env == (("A", "1"), ("B", "2"), ("_C", ""))
    assert spec.resources.labels == (("arch", "arm64"), ("k8s.io/x", ""), ("zone", "b"))
    assert spec.command == ("sh", "-c", "", "echo hi")
    assert spec.depends_on == ("alpha", "zeta")
    hash(spec)  # fully hashable: tuples all the way down


def test_a_dag_step_needs_no_schedule() -> None:
    assert spec_of(upsert_with(schedule=DELETE, depends_on=["extract"])).schedule is None
    assert spec_of(upsert_with(schedule=None, depends_on=["extract"])).schedule is None


def test_boundary_values_are_accepted() -> None:
    spec = spec_of(
        upsert_with(
            resources={"cpu": 1024, "memory_mb": 4_194_304, "gpu": 64},
            timeout_s=7 * 24 * 3600,
            retry={"max_attempts": 100, "backoff_s": 0, "backoff_multiplier": 1},
            jitter_s=3600,
            priority=-1000,
            job_id="a" * 128,
            owner="o" * 64,
            depends_on=[f"up{i}" for i in range(64)],
        )
    )
    assert spec.resources == Resources(cpu=1024.0, memory_mb=4_194_304, gpu=64)
    assert spec.retry.max_attempts == 100
    assert len(spec.depends_on) == 64
    assert spec_of(upsert_with(priority=1000, timeout_s=0.001)).priority == 1000


def test_records_are_frozen() -> None:
    cmd = accepted({"type": "job.pause", "job_id": "j1"})
    assert isinstance(cmd, PauseJob)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cmd.job_id = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec_of(MINIMAL).resources.cpu = 2.0  # type: ignore[misc]


# --- every rule, with a failing example ---------------------------------------------------

# (changes to MINIMAL, expected field, a fragment the reason must contain)
UPSERT_REJECTIONS: list[tuple[dict[str, object], str, str]] = [
    ({"job_id": DELETE}, "job_id", "missing required field 'job_id'"),
    ({"job_id": ""}, "job_id", "1 to 128"),
    ({"job_id": "a" * 129}, "job_id", "1 to 128"),
    ({"job_id": "-leading-dash"}, "job_id", "start with a letter or digit"),
    ({"job_id": "has space"}, "job_id", "'has space'"),
    ({"job_id": "a@b"}, "job_id", "'a@b'"),
    ({"job_id": "ünïcode"}, "job_id", "job_id must start"),
    ({"job_id": 42}, "job_id", "job_id must be a string, got integer"),
    ({"owner": DELETE}, "owner", "missing required field 'owner'"),
    ({"owner": "o" * 65}, "owner", "1 to 64"),
    ({"owner": "team a"}, "owner", "owner must start"),
    ({"schedule": "hourly"}, "schedule", "schedule must be an object"),
    ({"schedule": {"cron": "not a cron"}}, "schedule", "schedule"),
    ({"schedule": {"every": "30 parsecs"}}, "schedule", "schedule"),
    ({"schedule": {}}, "schedule", "schedule"),
    ({"schedule": [1, 2]}, "schedule", "schedule"),
    ({"notify": "https://h/x"}, "notify", "notify must be an object, got string"),
    ({"notify": {"on": ["failed"]}}, "notify.url", "missing required field 'notify.url'"),
    ({"notify": {"url": "ftp://h/x", "on": ["failed"]}}, "notify.url", "http:// or https://"),
    ({"notify": {"url": "https:///x", "on": ["failed"]}}, "notify.url", "with a host"),
    ({"notify": {"url": "https://h/\n", "on": ["failed"]}}, "notify.url", "http:// or https://"),
    ({"notify": {"url": "https://h/x"}}, "notify.on", "missing required field 'notify.on'"),
    ({"notify": {"url": "https://h/x", "on": []}}, "notify.on", "at least one of"),
    ({"notify": {"url": "https://h/x", "on": ["exploded"]}}, "notify.on", "'exploded'"),
    ({"notify": {"url": "https://h/x", "on": ["failed", "failed"]}}, "notify.on", "twice"),
    ({"notify": {"url": "https://h/x", "on": ["late"]}}, "notify.on", "no sla_s"),
    ({"notify": {"url": "https://h/x", "on": ["failed"], "to": 1}}, "notify.to", "unknown field"),
    ({"sla_s": 0}, "sla_s", "sla_s must be > 0"),
    ({"sla_s": -5}, "sla_s", "sla_s must be > 0"),
    ({"sla_s": "10"}, "sla_s", "sla_s must be a number"),
    ({"sla_s": 10**9}, "sla_s", "sla_s must be <= 604800"),
    ({"command": DELETE}, "command", "missing required field 'command'"),
    ({"command": []}, "command", "command must be a non-empty list"),
    ({"command": "ls -l"}, "command", "command must be a list, got string"),
    ({"command": [""]}, "command[0]", "command[0] (the program) must not be empty"),
    ({"command": ["ls", 5]}, "command[1]", "command[1] must be a string, got integer"),
    ({"command": ["ls", "a\x00b"]}, "command[1]", "NUL"),
    ({"command": ["x"] * 257}, "command", "at most 256"),
    ({"command": ["x" * 40_000]}, "command[0]", "at most 32768 characters"),
    ({"env": ["A=1"]}, "env", "env must be an object, got array"),
    ({"env": {"1BAD": "x"}}, "env", "env names must match"),
    ({"env": {"A-B": "x"}}, "env", "'A-B'"),
    ({"env": {"": "x"}}, "env", "env names must match"),
    ({"env": {"CRONLOG_RUN_ID": "x"}}, "env.CRONLOG_RUN_ID", "reserved"),
    ({"env": {"A": 1}}, "env.A", "env.A must be a string, got integer"),
    ({"env": {"A": {"secret": "a b"}}}, "env.A.secret", "a secret's name"),
    ({"env": {"A": {"secret": 7}}}, "env.A.secret", "must be a string, got integer"),
    ({"env": {"A": {"vault": "x"}}}, "env.A.vault", "unknown field"),
    ({"env": {"A": "a\x00"}}, "env.A", "NUL"),
    ({"env": {f"V{i}": "" for i in range(257)}}, "env", "at most 256"),
    ({"resources": "big"}, "resources", "resources must be an object, got string"),
    ({"resources": {"memory": 1}}, "resources.memory", "did you mean 'memory_mb'"),
    ({"resources__cpu": -1}, "resources.cpu", "resources.cpu must be >= 0, got -1"),
    ({"resources__cpu": 1025}, "resources.cpu", "resources.cpu must be <= 1024, got 1025"),
    ({"resources__cpu": True}, "resources.cpu", "resources.cpu must be a number, got boolean"),
    ({"resources__cpu": "1"}, "resources.cpu", "must be a number, got string"),
    ({"resources__cpu": float("nan")}, "resources.cpu", "finite"),
    ({"resources__cpu": float("inf")}, "resources.cpu", "finite"),
    ({"resources__memory_mb": -1}, "resources.memory_mb", ">= 0"),
    ({"resources__memory_mb": 4_194_305}, "resources.memory_mb", "<= 4194304"),
    ({"resources__memory_mb": 256.5}, "resources.memory_mb", "must be an integer, got number"),
    ({"resources__memory_mb": False}, "resources.memory_mb", "integer, got boolean"),
    ({"resources__gpu": -1}, "resources.gpu", ">= 0"),
    ({"resources__gpu": 65}, "resources.gpu", "<= 64"),
    ({"resources__gpu": 1.0}, "resources.gpu", "must be an integer"),
    ({"resources__memory_mb": 10**80}, "resources.memory_mb", "a very large integer"),
    ({"resources__labels": ["zone=a"]}, "resources.labels", "must be an object"),
    ({"resources__labels": {"bad key": "x"}}, "resources.labels", "'bad key'"),
    ({"resources__labels": {"k=v": "x"}}, "resources.labels", "keys must start"),
    ({"resources__labels": {"zone": 1}}, "resources.labels.zone", "must be a string"),
    ({"resources__labels": {"zone": "a\nb"}}, "resources.labels.zone", "control characters"),
    ({"resources__labels": {"z": "v" * 257}}, "resources.labels.z", "at most 256"),
    ({"resources__labels": {f"k{i}": "" for i in range(65)}}, "resources.labels", "at most 64"),
    ({"timeout_s": 0}, "timeout_s", "timeout_s must be > 0, got 0"),
    ({"timeout_s": -5}, "timeout_s", "timeout_s must be > 0"),
    ({"timeout_s": 604_801}, "timeout_s", "timeout_s must be <= 604800"),
    ({"timeout_s": "600"}, "timeout_s", "timeout_s must be a number, got string"),
    ({"timeout_s": True}, "timeout_s", "got boolean"),
    ({"retry": 3}, "retry", "retry must be an object, got integer"),
    ({"retry": {"attempts": 3}}, "retry.attempts", "did you mean 'max_attempts'"),
    ({"retry__max_attempts": 0}, "retry.max_attempts", "retry.max_attempts must be >= 1, got 0"),
    ({"retry__max_attempts": 101}, "retry.max_attempts", "<= 100"),
    ({"retry__max_attempts": 2.5}, "retry.max_attempts", "must be an integer"),
    ({"retry__max_attempts": True}, "retry.max_attempts", "got boolean"),
    ({"retry__backoff_s": -1}, "retry.backoff_s", "retry.backoff_s must be >= 0"),
    ({"retry__backoff_s": 86_401}, "retry.backoff_s", "<= 86400"),
    ({"retry__backoff_multiplier": 0.5}, "retry.backoff_multiplier", ">= 1, got 0.5"),
    ({"retry__backoff_multiplier": 11}, "retry.backoff_multiplier", "<= 10"),
    ({"retry__max_backoff_s": 5}, "retry.max_backoff_s", "must be >= retry.backoff_s"),
    ({"retry__max_backoff_s": 86_401}, "retry.max_backoff_s", "<= 86400"),
    ({"idempotent": "yes"}, "idempotent", "idempotent must be true or false, got string"),
    ({"idempotent": 1}, "idempotent", "got integer"),
    ({"depends_on": "extract"}, "depends_on", "depends_on must be a list, got string"),
    ({"depends_on": ["bad id"]}, "depends_on[0]", "depends_on[0] must start"),
    ({"depends_on": [7]}, "depends_on[0]", "must be a string"),
    ({"depends_on": ["a", "b", "a"]}, "depends_on[2]", "listed twice"),
    ({"depends_on": ["j1"]}, "depends_on[0]", "cannot depend on itself"),
    ({"depends_on": [f"u{i}" for i in range(65)]}, "depends_on", "at most 64"),
    ({"misfire": "sometimes"}, "misfire", "misfire must be one of run_all, run_once, skip"),
    ({"misfire": 1}, "misfire", "got integer"),
    ({"concurrency": "parallel"}, "concurrency", "one of allow, forbid, replace"),
    ({"dst": "never"}, "dst", "dst must be one of run_once, skip, both"),
    ({"jitter_s": -1}, "jitter_s", "jitter_s must be >= 0"),
    ({"jitter_s": 3601}, "jitter_s", "jitter_s must be <= 3600"),
    ({"jitter_s": False}, "jitter_s", "got boolean"),
    ({"priority": 1001}, "priority", "priority must be <= 1000"),
    ({"priority": -1001}, "priority", "priority must be >= -1000"),
    ({"priority": 1.5}, "priority", "priority must be an integer"),
    ({"timout_s": 600}, "timout_s", "unknown field 'timout_s'; did you mean 'timeout_s'?"),
    ({"owner_id": "x"}, "owner_id", "unknown field 'owner_id'"),
]


@pytest.mark.parametrize(
    ("changes", "field", "fragment"),
    UPSERT_REJECTIONS,
    ids=[f"{field}:{i}" for i, (_, field, _) in enumerate(UPSERT_REJECTIONS)],
)
def test_invalid_upserts_are_rejected_naming_the_field(
    changes: dict[str, object], field: str, fragment: str
) -> None:
    rejection = rejected(upsert_with(**changes))
    assert rejection.field == field
    assert field in rejection.reason
    assert fragment in rejection.reason


def test_a_job_with_neither_schedule_nor_upstreams_is_a_manual_job() -> None:
    """Run only when asked (run-now; issue 55): no schedule, said as nothing, null or
    `manual`, all the same spec; `manual` writes back as no schedule."""
    specs = [
        spec_of(upsert_with(schedule=DELETE)),
        spec_of(upsert_with(schedule=None)),
        spec_of(upsert_with(schedule="manual")),
    ]
    assert all(s.schedule is None and s.depends_on == () for s in specs)
    assert specs[0] == specs[1] == specs[2]
    assert upsert_document(specs[2]).get("schedule") is None


def test_only_the_program_must_be_non_empty() -> None:
    assert spec_of(upsert_with(command=["echo", "", ""])).command == ("echo", "", "")


OTHER_REJECTIONS: list[tuple[object, str | None, str]] = [
    ([], None, "command must be a JSON object, got array"),
    ("job.pause", None, "got string"),
    (None, None, "got null"),
    ({}, "type", "missing required field 'type'"),
    ({"type": "job.explode", "job_id": "j"}, "type", "unknown command type 'job.explode'"),
    ({"type": 3}, "type", "unknown command type integer; expected one of job.upsert"),
    ({"type": "job.pause"}, "job_id", "missing required field 'job_id'"),
    ({"type": "job.resume", "job_id": "a b"}, "job_id", "job_id must start"),
    ({"type": "job.delete", "job_id": ""}, "job_id", "job_id must be 1 to 128"),
    ({"type": "job.pause", "job_id": "j", "why": "x"}, "why", "unknown field 'why'"),
    ({"type": "job.run_now", "job_id": "j"}, "request_id", "missing required field 'request_id'"),
    ({"type": "job.run_now", "job_id": "j", "request_id": "r 1"}, "request_id", "request_id"),
    ({"type": "job.run_now", "job_id": "j", "request_id": "r" * 129}, "request_id", "1 to 128"),
    ({"type": "job.run_now", "job_id": "j", "request_id": 7}, "request_id", "must be a string"),
    ({"type": "job.backfill", "job_id": "j", "to": T0}, "from", "missing required field 'from'"),
    ({"type": "job.backfill", "job_id": "j", "from": T0}, "to", "missing required field 'to'"),
    (
        {"type": "job.backfill", "job_id": "j", "from": "2026-01-01T00:00:00", "to": T0},
        "from",
        "from must have an explicit offset or Z",
    ),
    (
        {"type": "job.backfill", "job_id": "j", "from": "2025-12-01", "to": T0},
        "from",
        "explicit offset",
    ),
    (
        {"type": "job.backfill", "job_id": "j", "from": T0, "to": "tomorrow"},
        "to",
        "to must be an ISO-8601 time, got 'tomorrow'",
    ),
    (
        {"type": "job.backfill", "job_id": "j", "from": T0_MS, "to": T0},
        "from",
        "from must be an ISO-8601 time string, got integer",
    ),
    (
        {"type": "job.backfill", "job_id": "j", "from": T0, "to": T0},
        "from",
        "'from' must be before 'to'",
    ),
    (
        {"type": "job.backfill", "job_id": "j", "from": "2026-02-01T00:00:00Z", "to": T0},
        "from",
        "'from' must be before 'to'",
    ),
    (
        {"type": "job.backfill", "job_id": "j", "from": T0, "to": "2027-01-03T00:00:01Z"},
        "to",
        "at most 366 days",
    ),
    (
        {"type": "job.backfill", "job_id": "j", "from": "1969-12-31T23:59:59Z", "to": T0},
        "from",
        "from must be in 1970-01-01 to 9999-12-31 UTC",
    ),
    (
        {
            "type": "job.backfill",
            "job_id": "j",
            "from": "9999-12-31T00:00:00Z",
            "to": "9999-12-31T23:00:00-14:00",
        },
        "to",
        "to must be in 1970-01-01 to 9999-12-31 UTC",
    ),
    ({"type": "run.cancel"}, "run_id", "missing required field 'run_id'"),
    ({"type": "run.cancel", "run_id": 12}, "run_id", "run_id must be a string"),
    ({"type": "run.cancel", "run_id": "nightly"}, "run_id", "run_id must be '{job_id}@"),
    ({"type": "run.cancel", "run_id": "a b@" + T0}, "run_id", "the job id in run_id"),
    ({"type": "run.cancel", "run_id": "@" + T0}, "run_id", "the job id in run_id"),
    ({"type": "run.cancel", "run_id": "j@yesterday"}, "run_id", "run_id must be"),
    ({"type": "run.cancel", "run_id": "j@2026-02-30T00:00:00Z"}, "run_id", "run_id must be"),
    ({"type": "run.cancel", "run_id": "j@2026-01-01T00:00:00+01:00"}, "run_id", "run_id"),
    ({"type": "run.cancel", "run_id": "j@2026-01-01T00:00:00.000Z"}, "run_id", "run_id"),
    ({"type": "run.cancel", "run_id": "j@manual:"}, "run_id", "the request id in run_id"),
    ({"type": "run.cancel", "run_id": "j@manual:a@b"}, "run_id", "the request id in run_id"),
    ({"type": "run.cancel", "run_id": "j@" + T0, "job_id": "j"}, "job_id", "unknown field"),
    ({"type": "run.rerun", "run_id": "j@" + T0}, "request_id", "missing required field"),
    ({"type": "run.rerun", "run_id": "j@" + T0, "request_id": "-x"}, "request_id", "must start"),
    ({"type": "job.pause", "job_id": "j", 1: "x"}, None, "field names must be strings"),
]


@pytest.mark.parametrize(
    ("doc", "field", "fragment"),
    OTHER_REJECTIONS,
    ids=[f"{field}:{i}" for i, (_, field, _) in enumerate(OTHER_REJECTIONS)],
)
def test_invalid_commands_are_rejected_naming_the_field(
    doc: object, field: str | None, fragment: str
) -> None:
    rejection = rejected(doc)
    assert rejection.field == field
    if field is not None:
        assert field in rejection.reason
    assert fragment in rejection.reason


def test_an_unknown_type_lists_the_known_ones() -> None:
    reason = rejected({"type": "x"}).reason
    assert reason.startswith("unknown command type 'x'; expected one of ")
    assert all(kind in reason for kind in COMMAND_TYPES)


def test_reasons_stay_short_for_huge_values() -> None:
    assert len(rejected(upsert_with(job_id="x y" * 40)).reason) < 300
    assert len(rejected(upsert_with(command=["x" * 40_000])).reason) < 300
    assert len(rejected(upsert_with(**{"z" * 10_000: 1})).reason) < 600


# --- the other commands, accepted ---------------------------------------------------------


def test_job_commands() -> None:
    assert accepted({"type": "job.pause", "job_id": "j"}) == PauseJob("j")
    assert accepted({"type": "job.resume", "job_id": "j"}) == ResumeJob("j")
    assert accepted({"type": "job.delete", "job_id": "j"}) == DeleteJob("j")
    assert accepted({"type": "job.run_now", "job_id": "j", "request_id": "r-1"}) == RunNow(
        "j", "r-1"
    )


def test_backfill_converts_offsets_to_utc_epoch_ms() -> None:
    cmd = accepted(
        {"type": "job.backfill", "job_id": "j", "from": "2026-01-01T00:00:00+01:00", "to": T0}
    )
    assert cmd == Backfill("j", T0_MS - 3_600_000, T0_MS)
    cmd = accepted(
        {"type": "job.backfill", "job_id": "j", "from": T0, "to": "2026-01-01T00:00:00.250Z"}
    )
    assert cmd == Backfill("j", T0_MS, T0_MS + 250)


def test_backfill_span_of_exactly_366_days_is_allowed() -> None:
    to = datetime.fromtimestamp((T0_MS + MAX_BACKFILL_SPAN_MS) / 1000, tz=UTC).isoformat()
    cmd = accepted({"type": "job.backfill", "job_id": "j", "from": T0, "to": to})
    assert cmd == Backfill("j", T0_MS, T0_MS + MAX_BACKFILL_SPAN_MS)


@pytest.mark.parametrize(
    "run_id",
    [
        scheduled_run_id("nightly-etl", T0_MS),
        scheduled_run_id("nightly-etl", T0_MS + 123),
        manual_run_id("nightly-etl", "req-7"),
        manual_run_id("nightly-etl", "2026-01-01T00.00"),
    ],
)
def test_run_commands_take_the_job_id_from_the_run_id(run_id: str) -> None:
    assert accepted({"type": "run.cancel", "run_id": run_id}) == CancelRun(run_id, "nightly-etl")
    cmd = accepted({"type": "run.rerun", "run_id": run_id, "request_id": "again"})
    assert cmd == RerunRun(run_id, "nightly-etl", "again")
    assert command_job_id(cmd) == "nightly-etl"


def test_command_job_id_is_the_job_of_every_command() -> None:
    commands: list[Command] = [
        UpsertJob(spec_of(MINIMAL)),
        PauseJob("j1"),
        ResumeJob("j1"),
        DeleteJob("j1"),
        RunNow("j1", "r"),
        Backfill("j1", 0, 1),
        CancelRun("j1@manual:r", "j1"),
        RerunRun("j1@manual:r", "j1", "r2"),
    ]
    assert {command_job_id(cmd) for cmd in commands} == {"j1"}


# --- parse_command: bytes in --------------------------------------------------------------


def test_parse_command_decodes_and_validates() -> None:
    assert parse_command(b'{"type": "job.pause", "job_id": "j"}') == PauseJob("j")


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b'{"type": NaN}', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, "not valid JSON"),
        (None, "command has no value"),
        (b"[1]", "must be a JSON object"),
    ],
)
def test_parse_command_rejects_what_is_not_a_json_object(raw: bytes | None, fragment: str) -> None:
    rejection = parse_command(raw)
    assert isinstance(rejection, Rejection)
    assert rejection.field is None
    assert fragment in rejection.reason


def test_the_size_limit_is_checked_before_decoding() -> None:
    body = b'{"type": "job.pause", "job_id": "j"}'
    exactly = body + b" " * (MAX_COMMAND_BYTES - len(body))
    assert parse_command(exactly) == PauseJob("j")
    rejection = parse_command(exactly + b" ")
    assert isinstance(rejection, Rejection)
    assert rejection.field is None
    assert f"{MAX_COMMAND_BYTES + 1} bytes; at most {MAX_COMMAND_BYTES}" in rejection.reason
    assert isinstance(parse_command(b"{" * (MAX_COMMAND_BYTES + 1)), Rejection)


# --- properties ---------------------------------------------------------------------------

FAST = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
# What a Python caller could hand validate_command: JSON plus NaN, huge ints, tuples, odd keys.
python_values = st.recursive(
    json_scalars | st.floats() | st.integers() | st.binary(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=10) | st.integers(), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = (*MINIMAL, "env", "resources", "timeout_s", "retry", "idempotent", "depends_on")
FIELDS += ("misfire", "concurrency", "dst", "jitter_s", "priority", "request_id", "run_id")
FIELDS += ("from", "to")


@FAST
@given(st.binary(max_size=300))
def test_parse_command_never_raises_on_arbitrary_bytes(raw: bytes) -> None:
    result = parse_command(raw)
    assert isinstance(result, Rejection) or command_job_id(result)


@FAST
@given(json_values)
def test_parse_command_never_raises_on_arbitrary_json(doc: object) -> None:
    result = parse_command(orjson.dumps(doc))
    assert result == validate_command(doc)


@FAST
@given(python_values)
def test_validate_command_never_raises_on_arbitrary_python_values(doc: object) -> None:
    result = validate_command(doc)
    assert isinstance(result, Rejection) or command_job_id(result)


@FAST
@given(
    st.sampled_from(COMMAND_TYPES),
    st.dictionaries(st.sampled_from(FIELDS), python_values, max_size=8),
)
def test_validate_command_never_raises_on_typed_documents(
    kind: str, fields: dict[str, object]
) -> None:
    result = validate_command({**fields, "type": kind})
    assert isinstance(result, Rejection) or command_job_id(result)


@FAST
@given(st.sampled_from([*FIELDS[1:], "resources__cpu", "retry__backoff_s"]), python_values)
def test_one_bad_field_in_a_valid_upsert_never_raises(key: str, value: object) -> None:
    result = validate_command(upsert_with(**{key: value}))
    assert isinstance(result, Rejection | UpsertJob)


schedule_values = st.fixed_dictionaries(
    {},
    optional={
        "cron": st.text(st.sampled_from("0123456789*/,-LW#? abcHR@"), max_size=30) | python_values,
        "timezone": st.sampled_from(["UTC", "Europe/Berlin", "Mars/Olympus", "../etc", ""])
        | python_values,
        "every": st.from_regex(r"-?[0-9]{0,12}[smhdx]?", fullmatch=True) | python_values,
        "at": st.sampled_from([T0, "2026-01-01T00:00:00", "2026-13-01T00:00:00Z"]) | python_values,
    },
)


@FAST
@given(schedule_values)
def test_any_schedule_value_is_a_schedule_or_a_rejection_naming_it(schedule: object) -> None:
    result = validate_command(upsert_with(schedule=schedule))
    if isinstance(result, Rejection):
        assert result.field == "schedule"
        assert result.reason.startswith("schedule")
        assert len(result.reason) < 400
    else:
        assert isinstance(result, UpsertJob)
        assert result.spec.schedule is not None


def test_a_huge_schedule_value_gives_a_short_reason() -> None:
    rejection = rejected(upsert_with(schedule={"cron": "1" * 60_000}))
    assert rejection.field == "schedule"
    assert len(rejection.reason) < 400


ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"


def identifiers(rest: str, max_size: int, first: str = ALNUM) -> st.SearchStrategy[str]:
    """`first` character then up to max_size - 1 of `rest`; cheaper than st.from_regex."""
    tails = st.text(st.sampled_from(rest), max_size=max_size - 1)
    return st.builds(str.__add__, st.sampled_from(first), tails)


ids = identifiers(ALNUM + "._-", 128)
owners = identifiers(ALNUM + "._-", 64)
texts = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
label_values = st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=12)
env_names = identifiers(ALNUM + "_", 16, first=ALNUM[:52] + "_").filter(
    lambda name: not name.startswith("CRONLOG_")
)
label_keys = identifiers(ALNUM + "._/-", 16)
VALID_SCHEDULES = [
    {"cron": "0 2 * * *", "timezone": "Europe/Berlin"},
    {"cron": "*/5 * * * *", "timezone": "UTC"},
    {"cron": "30 0 2 * * *", "timezone": "America/New_York"},
    {"every": "30s"},
    {"every": "2h"},
    {"at": "2026-12-01T10:00:00Z"},
]


def seconds(lo: float, hi: float) -> st.SearchStrategy[float | int]:
    return st.integers(math.ceil(lo), math.floor(hi)) | st.floats(lo, hi, allow_nan=False)


@st.composite
def valid_upserts(draw: st.DrawFn) -> dict[str, Any]:
    job_id = draw(ids)
    doc: dict[str, Any] = {"type": "job.upsert", "job_id": job_id, "owner": draw(owners)}
    doc["command"] = [draw(texts.filter(bool)), *draw(st.lists(texts, max_size=4))]
    depends_on = draw(st.lists(ids.filter(lambda up: up != job_id), max_size=4, unique=True))
    with_depends_on, with_schedule = draw(st.booleans()), draw(st.booleans())
    if depends_on or with_depends_on:
        doc["depends_on"] = depends_on
    if not depends_on or with_schedule:
        doc["schedule"] = draw(st.sampled_from(VALID_SCHEDULES))
    optional = {
        "env": st.dictionaries(env_names, texts, max_size=4),
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "cpu": seconds(0, 1024),
                "memory_mb": st.integers(0, 4_194_304),
                "gpu": st.integers(0, 64),
                "labels": st.dictionaries(label_keys, label_values, max_size=4),
            },
        ),
        "timeout_s": seconds(1, 7 * 24 * 3600) | st.floats(0, 1, exclude_min=True),
        "retry": retries(),
        "idempotent": st.booleans(),
        "misfire": st.sampled_from(MISFIRE_POLICIES),
        "concurrency": st.sampled_from(CONCURRENCY_POLICIES),
        "dst": st.sampled_from(DST_POLICIES),
        "jitter_s": seconds(0, 3600),
        "priority": st.integers(-1000, 1000),
    }
    for key, strategy in optional.items():
        if draw(st.booleans()):
            doc[key] = draw(strategy)
    return doc


@st.composite
def retries(draw: st.DrawFn) -> dict[str, Any]:
    retry: dict[str, Any] = {}
    if draw(st.booleans()):
        retry["max_attempts"] = draw(st.integers(1, 100))
    if draw(st.booleans()):
        retry["backoff_multiplier"] = draw(seconds(1, 10))
    backoff = draw(seconds(0, 86_400))
    if draw(st.booleans()):
        retry["backoff_s"] = backoff
    if draw(st.booleans()):
        retry["max_backoff_s"] = draw(seconds(retry.get("backoff_s", 10), 86_400))
    return retry


@FAST
@given(valid_upserts())
def test_a_generated_valid_upsert_always_parses(doc: dict[str, Any]) -> None:
    result = parse_command(orjson.dumps(doc))
    assert isinstance(result, UpsertJob), result
    spec = result.spec
    assert (spec.job_id, spec.owner) == (doc["job_id"], doc["owner"])
    assert spec.command == tuple(doc["command"])
    assert spec.env == tuple(sorted(doc.get("env", {}).items()))
    assert spec.depends_on == tuple(sorted(doc.get("depends_on", [])))
    assert spec.schedule == (parse_schedule(doc["schedule"]) if "schedule" in doc else None)
    resources = doc.get("resources", {})
    assert spec.resources.cpu == resources.get("cpu", 0)
    assert spec.resources.labels == tuple(sorted(resources.get("labels", {}).items()))
    assert spec.timeout_s == doc.get("timeout_s", 3600)
    default_attempts = 3 if doc.get("idempotent") else 1
    assert spec.retry.max_attempts == doc.get("retry", {}).get("max_attempts", default_attempts)
    assert spec.retry.max_backoff_s >= spec.retry.backoff_s
    assert spec.priority == doc.get("priority", 0)
    assert validate_command(doc) == result
