"""Jobs not as root: a real worker with `--run-as nobody` runs a real job as that user,
in a working directory it owns, unable to read the worker's own files; a worker started as root
without a choice refuses to start."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from streams.settings import Settings
from tests.support.nodes import ROOT, EventReader, Node, WorkerProc, env_for, job, send_commands

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="changing the jobs' user needs root"),
]


def test_a_worker_as_root_refuses_to_run_jobs_as_root_unless_told(topics: Settings) -> None:
    env = {k: v for k, v in env_for(topics).items() if k != "CRONLOG_WORKER_ALLOW_ROOT"}
    done = subprocess.run(
        [sys.executable, "-m", "connectors.cli", "worker", "--id", "refuses"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "--run-as USER" in done.stderr
    assert "--allow-root" in done.stderr


def test_jobs_run_as_the_given_user_in_a_directory_of_their_own(
    topics: Settings, tmp_path: Path
) -> None:
    nobody = pwd.getpwnam("nobody")
    script = (
        "id -u; stat -c %U .; "
        "cat ../../../../journal.jsonl >/dev/null 2>&1 && echo journal-readable "
        "|| echo journal-denied; "
        "ls ../../../.. >/dev/null 2>&1 && echo worker-dir-listable || echo worker-dir-denied; "
        'echo "$HOME $USER"'
    )
    node = Node(topics, "ra-n1", tmp_path).start()
    worker = WorkerProc(
        topics, "ra-w1", tmp_path, extra_env={"CRONLOG_WORKER_RUN_AS": "nobody"}
    ).start()
    events = EventReader(topics, "ra-events")
    try:
        send_commands(
            topics,
            [
                job("as-nobody", ["sh", "-c", script], schedule={"every": "2s"}),
            ],
        )
        events.wait_until(
            lambda: any(
                e.job_id == "as-nobody" and e.state == "succeeded" for e, _ in events.run_events()
            ),
            90,
            "a run as nobody",
        )
        send_commands(topics, [{"type": "job.pause", "job_id": "as-nobody"}])
    finally:
        events.close()
        worker.stop()
        node.stop()
    outputs = sorted((tmp_path / "state").glob("workers/ra-w1/runs/*/*/stdout"))
    assert outputs, "no run directory"
    lines = outputs[0].read_text().split()
    assert lines == [
        str(nobody.pw_uid),
        "nobody",
        "journal-denied",
        "worker-dir-denied",
        nobody.pw_dir,
        "nobody",
    ]
    work = outputs[0].parent / "work"  # its working directory; the output is not its
    assert work.stat().st_uid == nobody.pw_uid
    assert (work.stat().st_mode & 0o777) == 0o700
    assert outputs[0].stat().st_uid == os.geteuid()
    assert (outputs[0].parent.stat().st_mode & 0o777) == 0o711
