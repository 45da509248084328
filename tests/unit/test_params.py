"""Run parameters (streams/core/params.py and the ledger): declared with types and
defaults, given by run-now and backfill, kept by each run, received by its process."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.records import BackfillRequested, FireProposed, JobUpserted, RunNowRequested
from schemas.spec import Param
from streams.core.commands import Rejection, RunNow, UpsertJob, parse_command, upsert_document
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.params import (
    ParamError,
    as_env,
    parse_declarations,
    parse_values,
    resolve,
    substitute,
)
from tests.support.world import World

T0 = 1_800_000_000_000
DECLARED = {
    "day": {"type": "string", "default": "today"},
    "limit": {"type": "integer", "default": 100},
    "ratio": {"type": "number"},
    "dry": {"type": "boolean", "default": False},
}


def command(doc: dict[str, Any]) -> Any:
    return parse_command(orjson.dumps(doc))


def job(**extra: Any) -> dict[str, Any]:
    return {
        "type": "job.upsert",
        "job_id": "etl",
        "owner": "o",
        "schedule": {"every": "1h"},
        "command": ["etl", "--day={day}", "--limit", "{limit}", "{{literal}}"],
        "params": DECLARED,
        **extra,
    }


def test_declarations_parse_sorted_with_canonical_defaults_and_read_back() -> None:
    parsed = command(job(params_in_command=True))
    assert isinstance(parsed, UpsertJob)
    assert parsed.spec.params == (
        Param("day", "string", '"today"'),
        Param("dry", "boolean", "false"),
        Param("limit", "integer", "100"),
        Param("ratio", "number", None),
    )
    assert parsed.spec.params_in_command
    again = command(upsert_document(parsed.spec))
    assert isinstance(again, UpsertJob)
    assert again.spec == parsed.spec


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"1x": {"type": "string"}}, "params.1x", "a name starts with a letter"),
        ({"x": {"type": "date"}}, "params.x", "must be one of string, integer, number, boolean"),
        ({"x": {"type": "integer", "default": "5"}}, "params.x", "default must be an integer"),
        ({"x": {"type": "boolean", "default": 1}}, "params.x", "default must be a boolean"),
        ({"x": {"type": "string", "required": True}}, "params.x", "with type and, optionally"),
        ({f"p{i}": {"type": "string"} for i in range(33)}, "params", "at most 32"),
        ([1], "params", "must be an object"),
    ],
)
def test_a_bad_declaration_is_refused_naming_the_parameter(
    params: object, field: str, words: str
) -> None:
    refused = command(job(params=params))
    assert isinstance(refused, Rejection)
    assert refused.field == field
    assert words in refused.reason


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"x": None}, "not null"),
        ({"x": [1]}, "string, number or boolean"),
        ({"x": {"a": 1}}, "string, number or boolean"),
        ({"x": "v" * 1025}, "at most 1024 characters"),
        ({"bad name": 1}, "not a parameter name"),
        ({f"p{i}": "v" * 1000 for i in range(9)}, "at most 8192"),
    ],
)
def test_hostile_run_values_are_refused_before_the_log(params: dict[str, Any], words: str) -> None:
    doc = {"type": "job.run_now", "job_id": "etl", "request_id": "r1", "params": params}
    refused = parse_command(orjson.dumps(doc))
    assert isinstance(refused, Rejection)
    assert words in refused.reason


def test_a_value_json_cannot_carry_is_refused_too() -> None:
    with pytest.raises(ParamError, match="finite"):
        parse_values({"x": float("nan")})


def test_values_are_typed_against_the_declaration_over_the_defaults() -> None:
    declared = parse_declarations(DECLARED)
    values = resolve(declared, parse_values({"ratio": 0.5, "limit": 7}))
    assert values == (("day", '"today"'), ("dry", "false"), ("limit", "7"), ("ratio", "0.5"))
    assert orjson.loads(as_env(values)) == {"day": "today", "dry": False, "limit": 7, "ratio": 0.5}
    with pytest.raises(ParamError, match=r"params\.ratio is required"):
        resolve(declared, ())
    with pytest.raises(ParamError, match=r"params\.limit must be an integer"):
        resolve(declared, parse_values({"ratio": 1, "limit": "7"}))
    with pytest.raises(ParamError, match=r"declares no such parameter \(day, dry, limit, ratio\)"):
        resolve(declared, parse_values({"ratio": 1, "user": "root"}))
    assert resolve(declared, parse_values({"ratio": 2})) == resolve(
        declared, parse_values({"ratio": 2, "day": "today"})
    )


def test_substitution_replaces_names_keeps_escapes_and_unknown_braces() -> None:
    values = (("day", '"2026-12-01"'), ("limit", "7"), ("dry", "true"))
    argv = ("etl", "--day={day}", "{limit}", "{dry}", "{{day}}", "{other}", "}}{")
    assert substitute(argv, values) == (
        "etl",
        "--day=2026-12-01",
        "7",
        "true",
        "{day}",
        "{other}",
        "}{",
    )


@given(st.text(max_size=50))
def test_a_value_is_one_argument_whatever_it_holds(value: str) -> None:
    """No value can split, quote or inject into other arguments: argv is not a shell."""
    out = substitute(("run", "{v}", "{v}x"), (("v", orjson.dumps(value).decode()),))
    assert out == ("run", value, value + "x")


# -- the ledger ---------------------------------------------------------------------------
def world(**extra: Any) -> World:
    w = World()
    parsed = command(job(**extra))
    assert isinstance(parsed, UpsertJob)
    w.apply(JobUpserted(parsed.spec, T0))
    return w


def test_a_run_now_runs_with_its_values_and_the_process_gets_them() -> None:
    w = world(params_in_command=True)
    given_ = parse_values({"ratio": 0.25, "day": "2026-12-01"})
    w.apply(RunNowRequested("etl", "r1", T0 + 1, given_))
    run = w.runs[manual_run_id("etl", "r1")]
    assert dict(run.params) == {
        "day": '"2026-12-01"',
        "dry": "false",
        "limit": "100",
        "ratio": "0.25",
    }
    first, *_ = w.run_events(run.run_id)
    assert first.params == run.params  # the history keeps them, on the run's first event
    (request,) = w.dispatch
    env = dict(request.env)
    assert orjson.loads(env["CRONLOG_PARAMS"])["day"] == "2026-12-01"
    assert request.command == ("etl", "--day=2026-12-01", "--limit", "100", "{literal}")


def test_a_run_now_with_bad_values_is_dead_lettered_and_runs_nothing() -> None:
    w = world()
    decision = w.apply(RunNowRequested("etl", "r1", T0 + 1, parse_values({"ratio": "high"})))
    assert decision.dead_letter
    assert "params.ratio must be a number" in decision.rejected
    assert manual_run_id("etl", "r1") not in w.runs
    w.apply(RunNowRequested("etl", "r1", T0 + 2, parse_values({"ratio": 1})))  # key still free
    assert w.runs[manual_run_id("etl", "r1")].state == "due"


def test_a_scheduled_run_takes_the_defaults_or_is_skipped_naming_what_is_missing() -> None:
    w = world()
    t = T0 + 3_600_000
    w.apply(FireProposed("etl", t, t, "n"))
    skipped = w.runs[scheduled_run_id("etl", t)]
    assert skipped.state == "skipped"
    assert skipped.reason == "params.ratio is required (it has no default): give it to run-now"
    declared = dict(DECLARED, ratio={"type": "number", "default": 1.5})
    w2 = world(params=declared)
    w2.apply(FireProposed("etl", t, t, "n"))
    assert dict(w2.runs[scheduled_run_id("etl", t)].params)["ratio"] == "1.5"


def test_a_backfill_gives_its_values_to_every_run_it_creates() -> None:
    w = World()
    parsed = command(job(schedule={"every": "1m"}))
    assert isinstance(parsed, UpsertJob)
    w.apply(JobUpserted(parsed.spec, T0 + 600_000))
    given_ = parse_values({"ratio": 3})
    w.apply(BackfillRequested("etl", T0, T0 + 180_000, T0 + 600_001, "b1", given_))
    created = [r for r in w.runs.values() if r.trigger == "backfill"]
    assert len(created) == 4
    assert {dict(r.params)["ratio"] for r in created} == {"3"}


def test_run_now_commands_carry_their_values_to_the_ledger_input() -> None:
    parsed = command(
        {"type": "job.run_now", "job_id": "etl", "request_id": "r1", "params": {"limit": 5}}
    )
    assert parsed == RunNow("etl", "r1", (("limit", "5"),))


def test_values_that_are_not_json_written_past_the_parser_are_refused_not_raised() -> None:
    """A record written to job-log directly (not through the command parser) with value
    text that is not JSON, or a default that is not: the ledger refuses (dead letter) or
    skips, naming it; decide never raises (it would stop the ledger on that record)."""
    w = world(params_in_command=True)
    for bad in ("not json", "", '"unterminated', "NaN"):
        decision = w.apply(RunNowRequested("etl", f"r-{len(bad)}", T0 + 1, (("ratio", bad),)))
        assert decision.dead_letter
        assert "params.ratio is not a JSON value" in decision.rejected
    spec = w.jobs["etl"].spec
    broken = replace(spec, params=(Param("day", "string", "oops"),), schedule=spec.schedule)
    w.apply(JobUpserted(broken, T0 + 2))
    t = T0 + 3_600_000
    w.apply(FireProposed("etl", t, t, "n"))
    run = w.runs[scheduled_run_id("etl", t)]
    assert run.state == "skipped"
    assert "params.day.default is not a JSON value" in run.reason
