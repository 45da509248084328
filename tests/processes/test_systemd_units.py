"""The systemd unit files of docs/operations.md: valid for systemd, and every command
they start exists in the CLI with the options they pass."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "compose" / "systemd"
INSTALLED = "/opt/cronlog/venv/bin/cronlog"
CRONLOG = Path(sys.executable).parent / "cronlog"


def _units() -> list[Path]:
    found = sorted(UNITS.glob("*.service"))
    assert {p.name for p in found} == {
        "cronlog-scheduler@.service",
        "cronlog-worker@.service",
        "cronlog-projector.service",
        "cronlog-notifier.service",
        "cronlog-api.service",
    }
    return found


def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed on this machine")
    copies = []
    for unit in _units():
        # verify needs the executable to exist and a template needs an instance name.
        text = unit.read_text().replace(INSTALLED, str(CRONLOG))
        copy = tmp_path / unit.name.replace("@.", "@node-1.")
        copy.write_text(text)
        copies.append(str(copy))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *copies],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


@pytest.mark.parametrize("unit", _units(), ids=lambda p: p.name)
def test_exec_start_is_a_real_command(unit: Path) -> None:
    match = re.search(r"^ExecStart=(\S+) (.*)$", unit.read_text(), re.MULTILINE)
    assert match is not None
    assert match.group(1) == INSTALLED
    words = [w for w in match.group(2).split() if not w.startswith("$")]
    command = words[0]
    options = [w for w in words[1:] if w.startswith("--")]
    done = subprocess.run(
        [str(CRONLOG), command, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    for option in options:
        assert option in done.stdout, f"{unit.name}: `cronlog {command}` has no {option}"


def test_the_worker_unit_runs_jobs_as_a_user_of_their_own() -> None:
    """The shipped layout: jobs never run as the worker's user, nor as root, nor as the
    user of the other units (whose files hold the database's password)."""
    text = (UNITS / "cronlog-worker@.service").read_text()
    worker_user = re.search(r"^User=(\S+)$", text, re.MULTILINE)
    run_as = re.search(r"^ExecStart=.* --run-as (\S+)", text, re.MULTILINE)
    assert run_as is not None, "the worker unit runs jobs as its own user"
    others = {
        m.group(1)
        for unit in _units()
        for m in re.finditer(r"^User=(\S+)$", unit.read_text(), re.MULTILINE)
    }
    assert run_as.group(1) not in {"root", worker_user.group(1) if worker_user else "root"}
    assert run_as.group(1) not in others
    assert "UnsetEnvironment=CRONLOG_DATABASE_URL" in text
