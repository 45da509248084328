"""Issue 53, item 7 on real processes: a hostile parameter value (`; rm -rf /`, `-rf`,
`$(id)`) substituted as a whole argv item, or read from CRONLOG_PARAMS, reaches the job
as one literal argument, and nothing of it runs; written into `sh -c` it runs (the
hazard the README and docs/architecture.md name). Through exec directly, and through the
worker's executor process (the harness of tests/processes/test_executor.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from streams.core.params import ENV_NAME, as_env, as_mapping, substitute
from tests.processes.test_executor import Harness
from tests.processes.test_executor import make as make  # the fixture, reused

HOSTILE = ["; rm -rf /", "-rf", "--output=/etc/passwd", "$(id)", "`id`", "a b\tc\nd", "' \" \\ *"]
ECHO_ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


def values(**given: object) -> tuple[tuple[str, str], ...]:
    return as_mapping({name: orjson.dumps(v).decode() for name, v in given.items()})


@pytest.mark.parametrize("value", [v for v in HOSTILE if v])
def test_a_real_process_gets_the_hostile_value_as_one_argument(value: str, tmp_path: Path) -> None:
    """exec of the substituted argv (no shell): the program sees the value as one
    argument, and nothing of it runs (no file made by `; touch`, `$(touch)`)."""
    marker = tmp_path / "pwned"
    for hostile in (value, f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`"):
        argv = substitute(
            (sys.executable, "-c", ECHO_ARGV, "--day", "{day}", "--", "{day}"),
            values(day=hostile),
        )
        out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tmp_path)
        assert json.loads(out.stdout) == ["--day", hostile, "--", hostile]
    assert not marker.exists()


@pytest.mark.parametrize("value", [v for v in HOSTILE if v])
def test_in_a_shell_a_quoted_positional_argument_or_the_env_stays_literal(
    value: str, tmp_path: Path
) -> None:
    """The safe shell forms: `sh -c 'tool "$1"' sh {day}` and "$CRONLOG_PARAMS"."""
    marker = tmp_path / "pwned"
    for hostile in (value, f"; touch {marker}", f"$(touch {marker})"):
        given = values(day=hostile)
        argv = substitute(("sh", "-c", 'printf %s "$1"', "sh", "{day}"), given)
        env = {"PATH": os.environ["PATH"], ENV_NAME: as_env(given)}
        out = subprocess.run(argv, capture_output=True, text=True, check=True, env=env)
        assert out.stdout == hostile
        read = subprocess.run(
            ["sh", "-c", f'printf %s "${ENV_NAME}"'], capture_output=True, text=True, env=env
        )
        assert json.loads(read.stdout)["day"] == hostile
    assert not marker.exists()


def test_written_into_sh_c_a_value_is_shell_code_as_documented(tmp_path: Path) -> None:
    """The hazard the docs name, so that it stays named: the unsafe form runs the value."""
    marker = tmp_path / "pwned"
    argv = substitute(("sh", "-c", "echo {day}"), values(day=f"x; touch {marker}"))
    subprocess.run(argv, capture_output=True, check=True)
    assert marker.exists()


def test_the_executor_runs_a_hostile_value_as_one_literal_argument(
    make: Callable[..., Harness], tmp_path: Path
) -> None:
    """The dispatch as the ledger makes it (argv substituted, CRONLOG_PARAMS in the env)
    run by the worker's executor: the job's argv holds each value as one item."""
    marker = tmp_path / "pwned"
    h = make()
    h.renew()
    hostile = [*HOSTILE, f"; touch {marker}", f"$(touch {marker})"]
    keys = []
    for i, value in enumerate(hostile):
        given = values(day=value)
        argv = substitute((sys.executable, "-c", ECHO_ARGV, "--day", "{day}", "--", "{day}"), given)
        keys.append(h.start(f"p{i}", list(argv), env={ENV_NAME: as_env(given)}))
    for i, (key, value) in enumerate(zip(keys, hostile, strict=True)):
        result = h.finished(key)
        assert (result.outcome, result.exit_code) == ("exited", 0)
        out = (h.root / f"p{i}" / "stdout").read_text()
        assert json.loads(out) == ["--day", value, "--", value]
    assert not marker.exists()
