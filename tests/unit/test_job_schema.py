"""The job reference (streams/core/job_schema.py) held to the validator: every field it
reads is described, every default is the validator's, every example is accepted, an
editor's JSON Schema check agrees with the validator on good and bad jobs, and the
published reference files are fresh."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from jsonschema import Draft202012Validator

from schemas.spec import JobSpec
from streams.core.command_spec import (
    _NOTIFY_FIELDS,
    _RESOURCE_FIELDS,
    _RETRY_FIELDS,
    _UPSERT_FIELDS,
)
from streams.core.commands import Rejection, UpsertJob, parse_command
from streams.core.job_schema import job_file_schema, job_schema, reference_markdown
from streams.core.schedule import _SCHEDULE_KEYS

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = job_schema()
PROPERTIES: dict[str, dict[str, Any]] = SCHEMA["properties"]
MINIMAL = {"job_id": "j", "owner": "o", "schedule": {"every": "1m"}, "command": ["true"]}


def _parse(doc: dict[str, Any]) -> UpsertJob | Rejection:
    parsed = parse_command(orjson.dumps({"type": "job.upsert", **doc}))
    assert isinstance(parsed, UpsertJob | Rejection)
    return parsed


def _spec(doc: dict[str, Any]) -> JobSpec:
    parsed = _parse(doc)
    assert isinstance(parsed, UpsertJob), parsed
    return parsed.spec


def test_every_field_the_validator_reads_is_in_the_reference_and_nothing_else() -> None:
    assert set(PROPERTIES) == set(_UPSERT_FIELDS)
    assert set(PROPERTIES["resources"]["properties"]) == set(_RESOURCE_FIELDS)
    assert set(PROPERTIES["retry"]["properties"]) == set(_RETRY_FIELDS)
    assert set(PROPERTIES["notify"]["properties"]) == set(_NOTIFY_FIELDS)
    variants = [v for v in PROPERTIES["schedule"]["oneOf"] if v.get("type") == "object"]
    assert set().union(*(v["properties"] for v in variants)) == _SCHEDULE_KEYS


def _described(name: str, field: dict[str, Any]) -> list[str]:
    missing = [] if len(field.get("description", "")) >= 10 else [name]
    for sub, inner in field.get("properties", {}).items():
        missing += _described(f"{name}.{sub}", inner)
    for variant in field.get("oneOf", []):
        for sub, inner in variant.get("properties", {}).items():
            missing += _described(f"{name}.{sub}", inner)
    return missing


def test_every_field_and_subfield_has_a_description() -> None:
    missing = [m for name, f in PROPERTIES.items() for m in _described(name, f)]
    assert not missing, f"fields without a description: {missing}"


def _plain(value: object) -> object:
    """A JobSpec value as the JSON it is written as (tuples of pairs as objects)."""
    if isinstance(value, tuple):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {k: v for k, v in value}
        return [_plain(v) for v in value]
    return value


def test_every_default_is_what_the_validator_gives_a_job_that_leaves_the_field_out() -> None:
    spec = _spec(MINIMAL)
    checked = 0
    for name, field in PROPERTIES.items():
        if "default" not in field or name in ("env", "resources", "retry", "params"):
            continue
        assert _plain(getattr(spec, name)) == field["default"], name
        checked += 1
    for group in ("resources", "retry"):
        for sub, inner in PROPERTIES[group]["properties"].items():
            value = _plain(getattr(getattr(spec, group), sub))
            assert value == inner["default"] or (value == [] and inner["default"] == {}), sub
            checked += 1
    assert spec.env == ()
    assert spec.params == ()
    assert checked >= 20


def test_every_example_is_a_job_the_validator_accepts_and_the_schema_too() -> None:
    validator = Draft202012Validator(SCHEMA)
    tried = 0
    for name, field in PROPERTIES.items():
        for example in field.get("examples", []):
            doc = {**MINIMAL, name: example}
            if name == "notify" and "late" in example["on"]:
                doc["sla_s"] = 60
            assert isinstance(_parse(doc), UpsertJob), (name, example, _parse(doc))
            assert not list(validator.iter_errors(doc)), (name, example)
            tried += 1
    assert tried >= 15


@pytest.mark.parametrize(
    "bad",
    [
        {"timeout_s": -1},
        {"timeout_s": "1h"},
        {"misfire": "sometimes"},
        {"command": []},
        {"schedule": {"every": "5 minutes"}},
        {"schedule": {"cron": "0 * * * *", "every": "1m"}},
        {"retry": {"max_attempts": 0}},
        {"retry": {"attempts": 3}},
        {"resources": {"cpus": 2}},
        {"notify": {"url": "https://x.example"}},
        {"depends_on": ["a", "a"]},
        {"priority": 5000},
        {"env": {"1BAD": "x"}},
        {"exclude": [{"dates": ["25.12.2026"]}]},
        {"max_runs": 0},
        {"timeout": 60},
    ],
)
def test_a_job_the_schema_refuses_the_validator_refuses_too(bad: dict[str, Any]) -> None:
    """An editor's red squiggle is never a false alarm on these: both refuse them."""
    doc = {**MINIMAL, **bad}
    assert list(Draft202012Validator(SCHEMA).iter_errors(doc)), bad
    assert isinstance(_parse(doc), Rejection), bad


def test_the_demo_job_file_is_valid_for_an_editor() -> None:
    validator = Draft202012Validator(job_file_schema())
    for document in yaml.safe_load_all((ROOT / "examples" / "demo.yaml").read_text()):
        errors = [e.message for e in validator.iter_errors(document)]
        assert not errors, errors


def test_the_published_reference_and_schema_are_fresh() -> None:
    """docs/jobs.md and docs/job.schema.json are what the module makes: regenerate with
    `cronlog jobs schema --markdown > docs/jobs.md` and
    `cronlog jobs schema --file > docs/job.schema.json`."""
    assert (ROOT / "docs" / "jobs.md").read_text() == reference_markdown()
    published = json.loads((ROOT / "docs" / "job.schema.json").read_text())
    assert published == job_file_schema()
