"""The job reference: every field of a job document, its type, bounds, default and
meaning, as a JSON Schema (pure: no I/O).

One definition for every place a user reads it: the OpenAPI body of `POST/PUT/PATCH
/jobs`, `cronlog jobs schema`, `GET /schemas/job.json`, the schema of job files an
editor validates with (docs/job.schema.json) and docs/jobs.md. The bounds and defaults
are the validator's own constants (streams/core/command_spec.py), and
tests/unit/test_job_schema.py holds the rest to it: every field the validator reads is
here with a description, each default is what the validator gives when the field is
left out, each example is accepted by the validator, and the published files are what
this module makes.

The validator stays the authority (a JSON Schema cannot say "a cron expression that
fires" or "an upstream that exists"): the schema is what an editor can check before a
file is applied, and the reference a person reads.
"""

from __future__ import annotations

import json
from typing import Any, Final

from schemas.spec import CONCURRENCY_POLICIES, DST_POLICIES, MISFIRE_POLICIES, NOTIFY_ON
from streams.core.command_fields import MAX_JOB_ID_CHARS
from streams.core.command_spec import (
    DEFAULT_BACKOFF_MULTIPLIER,
    DEFAULT_BACKOFF_S,
    DEFAULT_IDEMPOTENT_MAX_ATTEMPTS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_BACKOFF_S,
    DEFAULT_TIMEOUT_S,
    MAX_ARGV,
    MAX_ATTEMPTS,
    MAX_BACKOFF_MULTIPLIER,
    MAX_BACKOFF_S,
    MAX_CPU,
    MAX_DEPENDS_ON,
    MAX_ENV_VARS,
    MAX_EXCLUDED,
    MAX_GPU,
    MAX_JITTER_S,
    MAX_LABELS,
    MAX_MEMORY_MB,
    MAX_OWNER_CHARS,
    MAX_PRIORITY,
    MAX_RUNS_LIMIT,
    MAX_SLA_S,
    MAX_TIMEOUT_S,
    MAX_URL_CHARS,
    MIN_PRIORITY,
)
from streams.core.params import MAX_PARAMS, PARAM_TYPES

SCHEMA_ID: Final = "https://cronlog.dev/schemas/job.json"
_NAME = "^[A-Za-z0-9][A-Za-z0-9._-]*$"  # job ids, owners, calendar names, secrets
_DAY = r"^\d{4}-\d{2}-\d{2}(\.\.\d{4}-\d{2}-\d{2})?$"
_INSTANT = "an ISO-8601 instant with an offset or Z, such as 2026-12-24T18:00:00Z"

# Which firings a change of each field changes (docs/jobs.md's last column).
_FIRINGS: Final[dict[str, str]] = {
    "schedule": "every firing from the change on; runs decided ahead are decided again",
    "depends_on": "when each run may start: firings decided ahead wait for (or stop "
    "waiting for) upstreams",
    "misfire": "what happens to firings missed while paused or down",
    "concurrency": "whether a firing starts, waits or replaces a run still going",
    "dst": "firings in a daylight-saving gap or repeat",
    "jitter_s": "the start time of every run (a fixed offset per job and firing)",
    "exclude": "the firings on the excluded days (recorded as skipped)",
    "max_runs": "the firings after the limit (none)",
    "params": "the values of runs decided after the change",
}


def _schedule() -> dict[str, Any]:
    bounds = {
        "start": {"type": "string", "description": f"No firing before this: {_INSTANT}."},
        "end": {"type": "string", "description": f"No firing after this: {_INSTANT}."},
    }
    return {
        "description": (
            "When the job fires: exactly one of `cron` (with `timezone`), `every` or `at`. "
            "Leave it out (null, or `manual`) for a job that runs when its upstreams "
            "(`depends_on`) succeeded, or, with none, only when asked (run-now): a manual "
            "job."
        ),
        "oneOf": [
            {
                "type": "object",
                "title": "cron",
                "properties": {
                    "cron": {
                        "type": "string",
                        "description": (
                            "5 fields (minute hour day-of-month month day-of-week), or 6 "
                            "with leading seconds (aliases such as @daily are not supported)."
                        ),
                        "examples": ["0 2 * * *", "*/15 9-17 * * 1-5"],
                    },
                    "timezone": {
                        "type": "string",
                        "default": "UTC",
                        "description": "The IANA time zone the expression is read in.",
                        "examples": ["Europe/Berlin"],
                    },
                    **bounds,
                },
                "required": ["cron"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "title": "every",
                "properties": {
                    "every": {
                        "type": "string",
                        "pattern": "^[0-9]+[smhd]$",
                        "description": (
                            "A fixed interval, 1s to 366d, anchored at the Unix epoch (it "
                            "never drifts: every node computes the same instants)."
                        ),
                        "examples": ["30s", "5m", "1h"],
                    },
                    **bounds,
                },
                "required": ["every"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "title": "at",
                "properties": {
                    "at": {
                        "type": "string",
                        "description": f"A one-off firing: {_INSTANT}.",
                        "examples": ["2026-12-24T18:00:00Z"],
                    }
                },
                "required": ["at"],
                "additionalProperties": False,
            },
            {"type": "null"},
            {"const": "manual", "description": "No schedule: runs only when asked."},
        ],
        "examples": [{"cron": "0 2 * * *", "timezone": "Europe/Berlin"}, {"every": "5m"}],
    }


def _properties() -> dict[str, dict[str, Any]]:
    return {
        "job_id": {
            "type": "string",
            "pattern": _NAME,
            "maxLength": MAX_JOB_ID_CHARS,
            "description": "The job's name, unique across owners; runs are named after it.",
            "examples": ["nightly-report"],
        },
        "owner": {
            "type": "string",
            "pattern": _NAME,
            "maxLength": MAX_OWNER_CHARS,
            "description": (
                "The team that owns the job. Through the API it must be the token's owner "
                "(an admin token may name any); in a job file it may come from `owner:` "
                "beside `jobs:`."
            ),
            "examples": ["payments"],
        },
        "schedule": _schedule(),
        "command": {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "maxItems": MAX_ARGV,
            "description": (
                "The program and its arguments (argv, no shell): run `sh -c` yourself for "
                "pipes. The program is looked up on the job's PATH."
            ),
            "examples": [["python3", "/opt/jobs/report.py", "--day", "yesterday"]],
        },
        "env": {
            "type": "object",
            "maxProperties": MAX_ENV_VARS,
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
            "additionalProperties": {
                "oneOf": [
                    {"type": "string"},
                    {
                        "type": "object",
                        "properties": {"secret": {"type": "string", "pattern": _NAME}},
                        "required": ["secret"],
                        "additionalProperties": False,
                    },
                ]
            },
            "description": (
                "Environment variables of every run: a value, or `{secret: NAME}` for a "
                "secret of the owner's that the worker resolves (the value never travels "
                "with the job). Names starting with CRONLOG_ are reserved."
            ),
            "default": {},
            "examples": [{"REGION": "eu-west-1", "DB_PASSWORD": {"secret": "db-password"}}],
        },
        "resources": {
            "type": "object",
            "properties": {
                "cpu": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_CPU,
                    "default": 0.0,
                    "description": "CPUs a run needs (fractions allowed).",
                },
                "memory_mb": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_MEMORY_MB,
                    "default": 0,
                    "description": "Memory a run needs, MB; also its limit on the worker.",
                },
                "gpu": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": MAX_GPU,
                    "default": 0,
                    "description": "GPUs a run needs.",
                },
                "labels": {
                    "type": "object",
                    "maxProperties": MAX_LABELS,
                    "additionalProperties": {"type": "string"},
                    "default": {},
                    "description": "Only workers with all these labels run it.",
                },
            },
            "additionalProperties": False,
            "default": {},
            "description": (
                "What a run needs of a worker: it is placed only where this fits for the "
                "run's expected duration."
            ),
            "examples": [{"cpu": 0.5, "memory_mb": 256, "labels": {"zone": "eu"}}],
        },
        "timeout_s": {
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": MAX_TIMEOUT_S,
            "default": DEFAULT_TIMEOUT_S,
            "description": "A run still going after this many seconds is stopped and fails.",
            "examples": [600],
        },
        "retry": {
            "type": "object",
            "properties": {
                "max_attempts": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_ATTEMPTS,
                    "default": DEFAULT_MAX_ATTEMPTS,
                    "description": (
                        f"Attempts a run may make, the first included ({DEFAULT_MAX_ATTEMPTS} "
                        f"by default, {DEFAULT_IDEMPOTENT_MAX_ATTEMPTS} for an idempotent job)."
                    ),
                },
                "backoff_s": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_BACKOFF_S,
                    "default": DEFAULT_BACKOFF_S,
                    "description": "Wait before the second attempt, seconds.",
                },
                "backoff_multiplier": {
                    "type": "number",
                    "minimum": 1,
                    "maximum": MAX_BACKOFF_MULTIPLIER,
                    "default": DEFAULT_BACKOFF_MULTIPLIER,
                    "description": "Each later wait is the one before times this.",
                },
                "max_backoff_s": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": MAX_BACKOFF_S,
                    "default": DEFAULT_MAX_BACKOFF_S,
                    "description": "No wait is longer (raised to backoff_s if that is longer).",
                },
            },
            "additionalProperties": False,
            "default": {},
            "description": "Attempts after a failure (a non-zero exit, a timeout).",
            "examples": [{"max_attempts": 3, "backoff_s": 30}],
        },
        "idempotent": {
            "type": "boolean",
            "default": False,
            "description": (
                "Whether running it twice is harmless: an idempotent job is retried by "
                "default and after its worker is lost; any other job is not retried unless "
                "`retry` asks, and a run whose worker was lost fails `lost`."
            ),
        },
        "depends_on": {
            "type": "array",
            "items": {"type": "string", "pattern": _NAME},
            "maxItems": MAX_DEPENDS_ON,
            "uniqueItems": True,
            "default": [],
            "description": (
                "Upstream jobs: a run starts once each upstream's run of the same period "
                "succeeded (skipped if one did not in time). Without a schedule, the job "
                "runs once per upstream period."
            ),
            "examples": [["extract", "transform"]],
        },
        "misfire": {
            "type": "string",
            "enum": list(MISFIRE_POLICIES),
            "default": "run_once",
            "description": (
                "Firings missed (paused, everything down): run_all runs each, run_once runs "
                "the newest once, skip runs none (recorded as skipped)."
            ),
        },
        "concurrency": {
            "type": "string",
            "enum": list(CONCURRENCY_POLICIES),
            "default": "allow",
            "description": (
                "A firing while the previous run still goes: allow starts it too, forbid "
                "skips it, replace cancels the previous run."
            ),
        },
        "dst": {
            "type": "string",
            "enum": list(DST_POLICIES),
            "default": "auto",
            "description": (
                "A wall-clock time that does not exist (spring forward) or exists twice (fall "
                "back): run_once at the shifted time / first occurrence, skip, both, or auto "
                "(cron's rule: jobs with a wildcard or step minute or hour follow elapsed "
                "time, the others run_once)."
            ),
        },
        "jitter_s": {
            "type": "number",
            "minimum": 0,
            "maximum": MAX_JITTER_S,
            "default": 0.0,
            "description": (
                "Spread starts over up to this many seconds after the firing time (a fixed "
                "offset per job and firing), so a thousand jobs at midnight do not start "
                "in the same second."
            ),
            "examples": [30],
        },
        "priority": {
            "type": "integer",
            "minimum": MIN_PRIORITY,
            "maximum": MAX_PRIORITY,
            "default": 0,
            "description": "Placed before lower priorities when workers are short of room.",
        },
        "notify": {
            "type": ["object", "null"],
            "properties": {
                "url": {
                    "type": "string",
                    "maxLength": MAX_URL_CHARS,
                    "description": "An http(s) URL the notifier POSTs to.",
                },
                "on": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(NOTIFY_ON)},
                    "minItems": 1,
                    "uniqueItems": True,
                    "description": "The run outcomes that call it (late needs `sla_s`).",
                },
            },
            "required": ["url", "on"],
            "additionalProperties": False,
            "default": None,
            "description": "A webhook called when a run fails, is lost, skipped or late.",
            "examples": [{"url": "https://hooks.example.com/cronlog", "on": ["failed", "lost"]}],
        },
        "sla_s": {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": MAX_SLA_S,
            "default": None,
            "description": "A run not started this many seconds after its time is late.",
            "examples": [120],
        },
        "managed_by": {
            "type": "string",
            "default": "",
            "description": (
                "Who keeps the definition: `cronlog apply` writes its name, and its --prune "
                "deletes only jobs that carry that name. Empty: kept by hand."
            ),
        },
        "params": {
            "type": "object",
            "maxProperties": MAX_PARAMS,
            "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "maxLength": 64},
            "additionalProperties": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": list(PARAM_TYPES)},
                    "default": {"description": "A value of the type; none: every run gives it."},
                },
                "required": ["type"],
                "additionalProperties": False,
            },
            "default": {},
            "description": (
                "Run parameters: each run gets every parameter's value (run-now and "
                "backfill may give them) as CRONLOG_PARAM_<NAME>."
            ),
            "examples": [{"day": {"type": "string", "default": "yesterday"}}],
        },
        "params_in_command": {
            "type": "boolean",
            "default": False,
            "description": "Replace `{name}` in the command's arguments by the run's values.",
        },
        "exclude": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "pattern": _NAME, "default": "exclude"},
                    "dates": {
                        "type": "array",
                        "items": {"type": "string", "pattern": _DAY},
                        "minItems": 1,
                    },
                },
                "required": ["dates"],
                "additionalProperties": False,
            },
            "default": [],
            "description": (
                f"Days the schedule does not run, in its time zone (at most {MAX_EXCLUDED} "
                "days or ranges): their firings are recorded skipped, naming the calendar."
            ),
            "examples": [[{"name": "holidays", "dates": ["2026-12-25", "2026-12-31..2027-01-01"]}]],
        },
        "max_runs": {
            "type": ["integer", "null"],
            "minimum": 1,
            "maximum": MAX_RUNS_LIMIT,
            "default": None,
            "description": "The most runs the schedule makes; none after (null: no limit).",
            "examples": [10],
        },
    }


def job_schema(*, for_files: bool = False) -> dict[str, Any]:
    """The JSON Schema of one job document: a job.upsert command's fields (its `type`
    optional). `for_files`: as a job file holds it (`owner` may come from the file,
    `calendars` names the file's calendars)."""
    properties = _properties()
    for name, firings in _FIRINGS.items():
        properties[name]["x-changes-firings"] = firings
    properties["type"] = {
        "const": "job.upsert",
        "description": "The command's type, on the topic path; optional elsewhere.",
    }
    required = ["job_id", "owner", "command"]
    if for_files:
        required.remove("owner")
        properties["calendars"] = {
            "type": "array",
            "items": {"type": "string"},
            "description": "Calendars of the files (`calendars:` beside `jobs:`) whose "
            "days this job does not run: added to `exclude`.",
        }
    return {
        "type": "object",
        "title": "cronlog job",
        "description": "A job: when it runs, what it runs, and how.",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def job_file_schema() -> dict[str, Any]:
    """The JSON Schema of a job file (`cronlog apply`): one job, a list of jobs, or
    `{owner, calendars, jobs}`."""
    job = {"$ref": "#/$defs/job"}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "cronlog job file",
        "description": "Jobs for `cronlog apply`: one job, a list of them, or {owner, jobs}.",
        "$defs": {"job": job_schema(for_files=True)},
        "oneOf": [
            job,
            {"type": "array", "items": job},
            {
                "type": "object",
                "properties": {
                    "owner": {
                        "type": "string",
                        "pattern": _NAME,
                        "description": "The owner of this file's jobs that name none.",
                    },
                    "calendars": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "array",
                            "items": {"type": "string", "pattern": _DAY},
                        },
                        "description": "Named lists of days jobs exclude (`calendars:`).",
                    },
                    "jobs": {"type": "array", "items": job},
                },
                "additionalProperties": False,
                "anyOf": [{"required": ["jobs"]}, {"required": ["calendars"]}],
            },
        ],
    }


def reference_markdown() -> str:
    """docs/jobs.md: every field, its type, default and meaning, and what a change of it
    changes, from `job_schema`."""
    schema = job_schema()
    lines = [
        "# Job reference",
        "",
        "Generated from `streams/core/job_schema.py` (`cronlog jobs schema --markdown`); "
        "`tests/unit/test_job_schema.py` fails when this file is stale. The same schema is "
        "the API's request body (`/docs`), `GET /schemas/job.json`, and "
        "[job.schema.json](job.schema.json) for editors.",
        "",
        "A job is a JSON object (or YAML in a job file). Required: "
        + ", ".join(f"`{name}`" for name in schema["required"])
        + ", and `schedule` unless `depends_on` names an upstream.",
        "",
        "| field | type | default | meaning | a change changes |",
        "|---|---|---|---|---|",
    ]
    for name, field in schema["properties"].items():
        if name == "type":
            continue
        default = "required" if name in schema["required"] else _default_of(field)
        lines.append(
            f"| `{name}` | {_type_of(field)} | {default} | "
            f"{_cell(field['description'])} | {_cell(field.get('x-changes-firings', ''))} |"
        )
        for sub, inner in field.get("properties", {}).items():
            needed = "required" if sub in field.get("required", ()) else _default_of(inner)
            lines.append(
                f"| `{name}.{sub}` | {_type_of(inner)} | {needed} | "
                f"{_cell(inner.get('description', ''))} | |"
            )
    lines += ["", "## Schedules", ""]
    for variant in schema["properties"]["schedule"]["oneOf"]:
        if variant.get("type") == "null":
            lines.append(
                "- none (`null`, `manual` or left out): runs when its upstreams succeeded; "
                "with no upstreams, only when asked (run-now): a manual job."
            )
            continue
        if "const" in variant:
            continue
        keys = ", ".join(
            f"`{key}`" + (" (required)" if key in variant["required"] else "")
            for key in variant["properties"]
        )
        lines.append(f"- **{variant['title']}**: {keys}.")
        for key, inner in variant["properties"].items():
            example = inner.get("examples")
            shown = f" Example: `{example[0]}`." if example else ""
            lines.append(f"  - `{key}`: {inner['description']}{shown}")
    lines += ["", "## Examples", ""]
    for name, field in schema["properties"].items():
        for example in field.get("examples", [])[:1]:
            lines.append(f"- `{name}`: `{_json(example)}`")
    return "\n".join(lines) + "\n"


def _type_of(field: dict[str, Any]) -> str:
    if "oneOf" in field:
        return "object or null"
    kind = field.get("type", "any")
    text = " or ".join(kind) if isinstance(kind, list) else kind
    if "enum" in field:
        text += ": " + ", ".join(f"`{v}`" for v in field["enum"])
    bounds = [
        f"{word} {field[key]:g}" if isinstance(field[key], float) else f"{word} {field[key]}"
        for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="))
        if key in field
    ]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _default_of(field: dict[str, Any]) -> str:
    return f"`{_json(field['default'])}`" if "default" in field else "none"


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")
