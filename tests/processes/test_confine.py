"""The cover over a worker's files (connectors/worker/confine.py), played by a job of the
worker's own user: it finds nothing of what is hidden, keeps its own working directory,
and cannot lift the cover from a user namespace of its own. Each attack is played
without the cover too, so the test shows the cover is what stops it."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from connectors.worker.confine import Confinement, confinement

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="playing another user needs root"),
]
NOBODY = pwd.getpwnam("nobody")


@dataclass(frozen=True)
class Worker:
    """A worker's layout, all of it readable by the job's user (the worker's own)."""

    state: Path
    work: Path
    token: Path
    journal: Path


@pytest.fixture
def worker() -> Iterator[Worker]:
    # Not under pytest's tmp_path: its parents are root's alone, and the job's user must
    # reach these files by permission (only the cover may stop it).
    tmp_path = Path(tempfile.mkdtemp(prefix="cronlog-confine-test-"))
    tmp_path.chmod(0o755)
    state = tmp_path / "state"
    work = state / "workers" / "w1" / "runs" / "r1" / "1" / "work"
    work.mkdir(parents=True)
    journal = state / "workers" / "w1" / "journal"
    journal.write_text("seal-of-another-run\n")
    token = tmp_path / "kafka.properties"
    token.write_text("sasl.password=hunter2\n")
    for path in (*[p for p in tmp_path.rglob("*")], tmp_path):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    try:
        yield Worker(state, work, token, journal)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _as_job(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(
        argv,
        cwd=cwd,
        user=NOBODY.pw_uid,
        group=NOBODY.pw_gid,
        extra_groups=[],
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _probe(w: Worker) -> list[str]:
    return [
        "sh",
        "-c",
        f"cat {w.journal} 2>/dev/null || echo journal-hidden; "
        f"cat {w.token} 2>/dev/null | grep -q hunter2 && echo token-read || echo token-hidden; "
        f"unshare -Urm sh -c 'umount -l {w.state}; umount -l {w.token}; cat {w.journal}' "
        "2>/dev/null || echo cover-held; "
        "echo mine > own && cat own",
    ]


def test_the_job_sees_only_its_own_directory(worker: Worker) -> None:
    made = confinement([worker.state, worker.token])
    assert isinstance(made, Confinement), made
    seen = _as_job(made.wrap(_probe(worker), worker.work), worker.work).split()
    assert seen == ["journal-hidden", "token-hidden", "cover-held", "mine"]
    assert (worker.work / "own").read_text() == "mine\n"  # its writes land where they should


def test_without_the_cover_the_same_job_reads_everything(worker: Worker) -> None:
    seen = _as_job(_probe(worker), worker.work).split()
    assert seen[:2] == ["seal-of-another-run", "token-read"]


def test_a_missing_program_is_said_as_without_bubblewrap(worker: Worker) -> None:
    made = confinement([worker.state])
    assert isinstance(made, Confinement), made
    with pytest.raises(FileNotFoundError, match="no-such-program"):
        made.wrap(["no-such-program"], worker.work, "/usr/bin:/bin")


def test_no_confinement_where_bubblewrap_cannot_run(tmp_path: Path) -> None:
    missing = confinement([tmp_path], program=str(tmp_path / "bwrap"))
    assert isinstance(missing, str)
    assert missing.startswith("bwrap cannot run")
    false = shutil.which("false")
    assert false is not None
    refused = confinement([tmp_path], program=false)
    assert isinstance(refused, str)
    assert refused.startswith("bwrap cannot make its namespaces")
