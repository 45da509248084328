"""Issue 53, item 7: a parameter value is its caller's text. Substituted as a whole argv
item (`["mytool", "--day", "{day}"]`) it is that one item, literal, whatever it holds;
read from CRONLOG_PARAMS it is data; only a command that writes it into shell code
(`sh -c "... {day} ..."`) or lets it stand as an option makes it more (README,
docs/architecture.md "Parameters"). Played here with hostile values through
`substitute` and `as_env` (what the ledger puts in a dispatch, streams/core/ledger/
kernel.py); tests/processes/test_params_exec.py runs real processes with them."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from connectors.apply import param_hazards
from schemas.spec import JobSpec
from streams.core.commands import UpsertJob, parse_command
from streams.core.params import as_env, as_mapping, substitute
from tests.unit.test_apply import Registry, caller, cronlog, write

HOSTILE = [
    "; rm -rf /",
    "-rf",
    "--output=/etc/passwd",
    "$(id)",
    "`id`",
    "a b\tc\nd",  # whitespace: never a split
    "' \" \\ $HOME * ? [a]",
    "{day}",  # a value that looks like a placeholder is not substituted again
    "{{",
    "",
]


def values(**given: object) -> tuple[tuple[str, str], ...]:
    return as_mapping({name: orjson.dumps(v).decode() for name, v in given.items()})


@pytest.mark.parametrize("value", HOSTILE)
def test_a_whole_item_placeholder_is_one_literal_item(value: str) -> None:
    argv = substitute(("mytool", "--day", "{day}", "--", "{day}"), values(day=value))
    assert argv == ("mytool", "--day", value, "--", value)


@given(
    st.text(
        alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        max_size=200,
    )
)
def test_any_value_stays_one_item_and_verbatim(value: str) -> None:
    argv = substitute(("t", "{v}", "--v={v}"), values(v=value))
    assert argv == ("t", value, f"--v={value}")


@pytest.mark.parametrize("value", HOSTILE)
def test_cronlog_params_gives_the_value_back_exactly(value: str) -> None:
    assert json.loads(as_env(values(day=value, n=3))) == {"day": value, "n": 3}


# `cronlog apply`/`diff` name the unsafe forms (connectors/apply.py `param_hazards`):
# warned on stderr, refused with --strict-params.


def job(command: list[str], kind: str = "string", in_command: bool = True) -> JobSpec:
    default: object = "x" if kind == "string" else 1
    doc = {
        "job_id": "j",
        "owner": "team",
        "schedule": {"every": "1h"},
        "command": command,
        "params": {"day": {"type": kind, "default": default}},
        "params_in_command": in_command,
    }
    parsed = parse_command(orjson.dumps({"type": "job.upsert", **doc}))
    assert isinstance(parsed, UpsertJob), parsed
    return parsed.spec


@pytest.mark.parametrize(
    ("command", "says"),
    [
        (["sh", "-c", "echo {day}"], "command[2] is code sh runs"),
        (["/bin/bash", "-ec", "tool --day={day}"], "command[2] is code /bin/bash runs"),
        (["python3", "-c", "print('{day}')"], "command[2] is code python3 runs"),
        (["rm", "{day}"], "command[1] is {day} alone, before any `--`"),
    ],
)
def test_the_unsafe_forms_are_named(command: list[str], says: str) -> None:
    (hazard,) = param_hazards(job(command))
    assert hazard.startswith(says)


@pytest.mark.parametrize(
    "command",
    [
        ["mytool", "--day", "{day}"],
        ["rm", "--", "{day}"],
        ["mytool", "--day={day}"],
        ["sh", "-c", 'mytool --day "$1"', "sh", "{day}"],
        ["sh", "-c", 'mytool --day "$(printf %s "$CRONLOG_PARAMS" | jq -r .day)"'],
    ],
)
def test_the_safe_forms_are_not(command: list[str]) -> None:
    assert param_hazards(job(command)) == []


def test_no_hazard_without_values_in_the_command_or_for_a_number() -> None:
    assert param_hazards(job(["sh", "-c", "echo {day}"], in_command=False)) == []
    assert param_hazards(job(["rm", "{day}"], kind="integer")) == []


UNSAFE_JOB = """\
owner: team
jobs:
- job_id: report
  schedule: {every: 1h}
  command: [sh, -c, "report --day {day}"]
  params: {day: {type: string, default: yesterday}}
  params_in_command: true
"""


def test_diff_warns_and_strict_params_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(tmp_path, "jobs.yaml", UNSAFE_JOB)
    registry = Registry([])
    drift = cronlog(monkeypatch, caller("direct", registry), "diff", "-f", str(path))
    assert drift.exit_code == 1  # a new job: drift, as without the warning
    assert f"warning: {path}:3: job report: command[2] is code sh runs" in drift.stderr
    assert "+ report (create)" in drift.stdout
    strict = cronlog(
        monkeypatch, caller("direct", registry), "apply", "-f", str(path), "--strict-params"
    )
    assert strict.exit_code == 1
    assert "--strict-params: 1 parameter hazard(s)" in strict.stderr
    assert registry.put == []
