"""Every limit is checked on what will be written (issue 53 item 1): a dispatched
command's argv after `{name}` substitution and its env with the run's values
(`streams/core/params.py` `written`), wherever the ledger accepts values or dispatches a
run. Before, twenty kilobytes of `{v}` and one 1 KiB value made a 7 MB dispatch request,
which no topic takes: the ledger's transaction failed on it for ever."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.codec import DISPATCH
from schemas.records import (
    BackfillRequested,
    DeadlineReached,
    FireProposed,
    JobUpserted,
    RerunRequested,
    RunNowRequested,
)
from schemas.spec import JobSpec
from streams.core import command_spec
from streams.core.commands import MAX_COMMAND_BYTES, Rejection, UpsertJob, parse_command
from streams.core.ids import manual_run_id, scheduled_run_id
from streams.core.params import (
    ENV_NAME,
    MAX_ARG_CHARS,
    MAX_ENV_VALUE_CHARS,
    MAX_WRITTEN_BYTES,
    ParamError,
    as_env,
    parse_values,
    resolve,
    substitute,
    written,
)
from tests.support.world import World

T0 = 1_800_000_000_000
HOUR = 3_600_000
KIB_VALUE = "a" * 1024
# The reproduction: 20 KB of `{v}` in one argument (within the 32 KiB an argument may
# have, and the 64 KiB a command may be), a value of 1 KiB (the most a value may be).
REPEATED = "{v}" * 6800


def spec(argv: list[str], default: str | None = "x", **extra: Any) -> JobSpec:
    decl: dict[str, Any] = {"type": "string"}
    if default is not None:
        decl["default"] = default
    doc = {
        "type": "job.upsert",
        "job_id": "big",
        "owner": "o",
        "schedule": {"every": "1h"},
        "command": argv,
        "params": {"v": decl},
        "params_in_command": True,
        **extra,
    }
    parsed = parse_command(orjson.dumps(doc))
    assert isinstance(parsed, UpsertJob), parsed
    return parsed.spec


def world(job: JobSpec) -> World:
    w = World()
    w.apply(JobUpserted(job, T0))
    return w


def _dispatched_size(w: World) -> int:
    return max((len(DISPATCH.encode(r)) for r in w.dispatch), default=0)


def test_the_limits_as_written_are_the_registration_s() -> None:
    assert MAX_WRITTEN_BYTES == MAX_COMMAND_BYTES
    assert MAX_ARG_CHARS == command_spec.MAX_ARG_CHARS
    assert MAX_ENV_VALUE_CHARS == command_spec.MAX_ENV_VALUE_CHARS


def test_a_run_now_whose_value_makes_the_command_megabytes_is_dead_lettered() -> None:
    """The reproduction: accepted before, and dispatched as 7 MB."""
    w = world(spec(["echo", REPEATED]))
    decision = w.apply(RunNowRequested("big", "r1", T0 + 1, parse_values({"v": KIB_VALUE})))
    assert decision.dead_letter
    assert "command[1]" in decision.rejected
    assert "at most 32768" in decision.rejected
    assert manual_run_id("big", "r1") not in w.runs
    assert w.dispatch == []
    # The same job with a small value runs: the request id stays free.
    w.apply(RunNowRequested("big", "r1", T0 + 2, parse_values({"v": "b"})))
    (request,) = w.dispatch
    assert request.command == ("echo", "b" * 6800)


def recorded(job: JobSpec, default: str) -> JobSpec:
    """`job` with every parameter's default set to `default`: a job registered before
    registration checked its defaults as written, as the job log still holds it."""
    text = orjson.dumps(default).decode()
    return replace(job, params=tuple(replace(p, default=text) for p in job.params))


def test_a_default_that_makes_the_command_too_large_fails_the_scheduled_run_naming_it() -> None:
    """No run-now at all: the schedule's firing takes the default. Before, it was
    dispatched as 7 MB; now the run goes `failed` with the reason, nothing dispatched.
    Such a job is refused at registration now (the next test), so it is one registered
    before that check: its record, as the job log still holds it."""
    w = world(recorded(spec(["echo", REPEATED]), KIB_VALUE))
    t = T0 + HOUR
    w.apply(FireProposed("big", t, t, "n"))
    run = w.runs[scheduled_run_id("big", t)]
    assert run.state == "failed"
    assert "as dispatched" in run.reason or "command[1]" in run.reason
    assert w.dispatch == []
    assert w.states(run.run_id) == ["due", "failed"]


def test_a_job_whose_defaults_make_the_command_too_large_is_refused_at_registration() -> None:
    """On the topic as on the API (both parse it here): every run of its schedule would
    fail, so the job itself is refused, naming the limit and the defaults."""
    doc = {
        "type": "job.upsert",
        "job_id": "big",
        "owner": "o",
        "schedule": {"every": "1h"},
        "command": ["echo", REPEATED],
        "params": {"v": {"type": "string", "default": KIB_VALUE}},
        "params_in_command": True,
    }
    refused = parse_command(orjson.dumps(doc))
    assert isinstance(refused, Rejection)
    assert "with the defaults" in refused.reason
    assert "at most" in refused.reason


def test_the_whole_command_is_bounded_not_only_each_argument() -> None:
    """Many arguments, each within its 32 KiB, together past 64 KiB once substituted."""
    w = world(spec(["echo", *(["{v}" * 8] * 20)]))
    decision = w.apply(RunNowRequested("big", "r1", T0 + 1, parse_values({"v": KIB_VALUE})))
    assert decision.dead_letter
    assert "as dispatched" in decision.rejected
    assert f"at most {MAX_WRITTEN_BYTES}" in (decision.rejected)
    assert w.dispatch == []


def test_a_backfill_whose_values_make_the_command_too_large_creates_nothing() -> None:
    job = spec(["echo", REPEATED])
    w = World()
    w.apply(JobUpserted(job, T0 + 10 * HOUR))
    given_ = parse_values({"v": KIB_VALUE})
    decision = w.apply(BackfillRequested("big", T0, T0 + 5 * HOUR, T0 + 10 * HOUR + 1, "b", given_))
    assert decision.dead_letter
    assert "command[1]" in decision.rejected
    assert not [r for r in w.runs.values() if r.trigger == "backfill"]
    assert w.dispatch == []


def test_a_rerun_of_a_run_too_large_as_written_is_refused_and_dead_lettered() -> None:
    w = world(recorded(spec(["echo", REPEATED]), KIB_VALUE))
    t = T0 + HOUR
    w.apply(FireProposed("big", t, t, "n"))
    run_id = scheduled_run_id("big", t)
    decision = w.apply(RerunRequested("big", run_id, "again", t + 1))
    assert decision.dead_letter
    assert "command[1]" in decision.rejected
    assert w.runs[run_id].state == "failed"
    assert w.dispatch == []


def test_a_run_dispatched_again_under_a_larger_command_fails_instead() -> None:
    """A run made under a small command; the job's command changes to one that its kept
    value makes megabytes; its claim deadline dispatches it again: it fails, naming why."""
    w = world(spec(["echo", "{v}"]))
    w.apply(RunNowRequested("big", "r1", T0 + 1, parse_values({"v": KIB_VALUE})))
    run_id = manual_run_id("big", "r1")
    first = w.runs[run_id]
    assert first.state == "due"
    assert len(w.dispatch) == 1
    w.apply(JobUpserted(spec(["echo", REPEATED]), T0 + 2))
    assert first.deadline_ms is not None
    w.apply(DeadlineReached("big", run_id, first.attempt, "claim", first.deadline_ms))
    run = w.runs[run_id]
    assert run.state == "failed"
    assert "command[1]" in run.reason
    assert len(w.dispatch) == 1


def test_the_values_variable_is_bounded_as_written() -> None:
    """Thirty-two defaults of 1,024 characters each: each within its limit as declared,
    the registration within its 64 KiB, and 33,000 characters in CRONLOG_PARAMS, past
    the 32 KiB a variable may hold."""
    params = {f"p{i:02d}": {"type": "string", "default": "x"} for i in range(32)}
    doc = {
        "type": "job.upsert",
        "job_id": "env",
        "owner": "o",
        "schedule": {"every": "1h"},
        "command": ["true"],
        "params": params,
    }
    parsed = parse_command(orjson.dumps(doc))
    assert isinstance(parsed, UpsertJob), parsed
    refused = parse_command(orjson.dumps(doc).replace(b'"x"', orjson.dumps(KIB_VALUE)))
    assert isinstance(refused, Rejection)
    assert ENV_NAME in refused.reason
    job = recorded(parsed.spec, KIB_VALUE)
    with pytest.raises(ParamError, match=ENV_NAME):
        written(job, resolve(job.params, ()))
    w = world(job)
    t = T0 + HOUR
    w.apply(FireProposed("env", t, t, "n"))
    assert w.runs[scheduled_run_id("env", t)].state == "failed"
    assert w.dispatch == []


@settings(max_examples=100)
@given(
    parts=st.lists(
        st.tuples(st.integers(0, 12_000), st.text("ab {}-", max_size=6)), min_size=1, max_size=4
    ),
    value=st.text(min_size=0, max_size=1024),
    env_value=st.text(max_size=200),
)
def test_what_the_ledger_dispatches_is_within_every_limit_as_written(
    parts: list[tuple[int, str]], value: str, env_value: str
) -> None:
    """Whatever the argv and value: a run-now is either refused (dead-lettered) or
    dispatched within every limit as written (each argument, the values' variable, the
    whole), the same argv and env the substitution gives; nothing the ledger writes for
    it comes near a topic's 1 MB."""
    argv = ["run", *(("{v}" * n)[: MAX_ARG_CHARS - len(tail)] + tail for n, tail in parts)]
    doc_env = {"E": env_value.replace("\x00", "")}
    try:
        job = spec(argv, env=doc_env)
    except AssertionError:  # the registration itself refused: nothing to dispatch
        return
    w = world(job)
    given_ = parse_values({"v": value.replace("\x00", "")})
    decision = w.apply(RunNowRequested("big", "r1", T0 + 1, given_))
    if decision.dead_letter:
        assert w.dispatch == []
        with pytest.raises(ParamError):
            written(job, resolve(job.params, given_))
        return
    (request,) = w.dispatch
    values = resolve(job.params, given_)
    assert request.command == substitute(job.command, values)
    assert dict(request.env)[ENV_NAME] == as_env(values)
    assert all(len(a) <= MAX_ARG_CHARS for a in request.command)
    assert len(dict(request.env)[ENV_NAME]) <= MAX_ENV_VALUE_CHARS
    total = sum(len(a.encode()) for a in request.command)
    total += sum(len(n.encode()) + len(v.encode()) for n, v in request.env)
    assert total <= MAX_WRITTEN_BYTES
    assert _dispatched_size(w) < 200_000
