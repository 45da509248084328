"""Issue 53's attacks on the job boundary, each played by an ordinary owner's job against
a real worker: one that runs its jobs as itself under bubblewrap (started as `nobody`,
no --run-as), and one started as root that runs them as `nobody` (--run-as), now under
bubblewrap too.

- (3) an owner's LD_PRELOAD must not run in bwrap, which starts before any namespace
  exists: before issue 53 bwrap got the job's environment, and the library read the
  secrets folder from it (own-user worker);
- (4) a job that kills every process it can see, its parents first, must not stop its
  worker nor any other owner's run: before, it killed the worker and its executor
  (own-user worker) or the other owners' jobs, of the same user (run-as worker);
- (10) a job's output on the worker's disk stops at the cap, and the run says why:
  before, it grew without bound (only its first 1 MiB was shipped);
- a file one run leaves in /tmp is not there for a later run: before, /tmp was shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.records import RunEvent
from streams.settings import Settings
from tests.integration.test_job_boundary import (
    AS_NOBODY,
    NOBODY,
    _python_for_nobody,
    _run_logs,
)
from tests.processes.test_confine import PRELOAD_SOURCE
from tests.support.nodes import EventReader, Node, WorkerProc, job, send_commands

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="playing the jobs' user needs root"),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]
FINALS = ("succeeded", "failed", "cancelled", "skipped")
CAP_MB = 1
MIB = 1024 * 1024


@dataclass
class Home:
    """Folders anyone may traverse (the job's user must reach its run directories by
    their path), with a secret only the worker's user may read."""

    root: Path
    state: Path
    secrets: Path
    logs: Path
    marker: str
    library: Path


@pytest.fixture
def home() -> Iterator[Home]:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc) to build the LD_PRELOAD library")
    root = Path(tempfile.mkdtemp(prefix="cronlog-sandbox-"))
    root.chmod(0o755)
    state, secrets, logs = root / "state", root / "secrets", root / "logs"
    for folder in (state, secrets, logs):
        folder.mkdir()
    marker = f"MARKER-{uuid.uuid4().hex}"
    (secrets / "probe").write_text(marker + "\n")
    (secrets / "probe").chmod(0o600)
    for path in (state, secrets, secrets / "probe"):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    secrets.chmod(0o700)
    # The owner's library, where the job finds it too (outside /tmp, which is private).
    library = Path(tempfile.mkdtemp(prefix="cronlog-preload-", dir="/var/lib"))
    library.chmod(0o755)
    (library / "grab.c").write_text(PRELOAD_SOURCE)
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-o", str(library / "grab.so"), str(library / "grab.c")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    try:
        yield Home(root, state, secrets, logs, marker, library / "grab.so")
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(library, ignore_errors=True)


def _finals(events: EventReader, job_id: str) -> list[RunEvent]:
    return [e for e, _ in events.run_events() if e.job_id == job_id and e.state in FINALS]


def _run_now(settings: Settings, job_id: str) -> None:
    request: dict[str, object] = {
        "type": "job.run_now",
        "job_id": job_id,
        "request_id": uuid.uuid4().hex[:8],
    }
    send_commands(settings, [request])


def _wait_final(events: EventReader, job_id: str) -> RunEvent:
    events.wait_until(lambda: bool(_finals(events, job_id)), 90, f"the run of {job_id}")
    return _finals(events, job_id)[0]


# Kills the other owner's run (every process it can find whose command line carries the
# tag: only this test's, never another process of the same user on this machine), then
# its own ancestors from the farthest (the worker: the executor's parent; the executor:
# bwrap's parent) down.
KILLER = """
chain=""
p=$PPID
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  chain="$p $chain"
  p=$(awk '/^PPid:/ {print $2}' /proc/$p/status 2>/dev/null)
done
echo "ancestors: $chain"
for d in /proc/[0-9]*; do
  n=${d#/proc/}
  if tr '\\0' ' ' < $d/cmdline 2>/dev/null | grep -q "$0-victim"; then
    kill -9 "$n" 2>/dev/null && echo "killed $n"
  fi
done
echo hunted
for n in $chain; do kill -9 "$n" 2>/dev/null; done
"""


def _play(topics: Settings, worker: WorkerProc, prefix: str, home: Home, own_user: bool) -> None:
    """Every attack against the running `worker`; the checks of each are its own."""
    node = Node(topics, f"{prefix}-n1", home.logs).start()
    worker.start()
    events = EventReader(topics, f"{prefix}-events")
    tag = uuid.uuid4().hex[:12]
    once = {"retry": {"max_attempts": 1}}
    try:
        send_commands(
            topics,
            [
                job(
                    f"{prefix}-steady",
                    ["sh", "-c", "sleep 8; echo steady-done", f"{tag}-victim"],
                    owner="other",
                ),
                job(f"{prefix}-killer", ["sh", "-c", KILLER, tag], **once),
                job(
                    f"{prefix}-flood", ["sh", "-c", "head -c 5242880 /dev/zero; echo after"], **once
                ),
                job(
                    f"{prefix}-planter",
                    ["sh", "-c", f"echo x > /tmp/p-{tag}; echo x > /dev/shm/p-{tag}"],
                ),
                job(
                    f"{prefix}-peeker",
                    ["sh", "-c", f"cat /tmp/p-{tag} /dev/shm/p-{tag} 2>/dev/null || echo unseen"],
                ),
                job(
                    f"{prefix}-preload",
                    ["true"],
                    env={"LD_PRELOAD": str(home.library), "GRAB": str(home.secrets / "probe")},
                ),
            ],
        )
        _run_now(topics, f"{prefix}-steady")
        events.wait_until(
            lambda: any(
                e.job_id == f"{prefix}-steady" and e.state == "running"
                for e, _ in events.run_events()
            ),
            90,
            "the steady run's start",
        )
        _run_now(topics, f"{prefix}-killer")
        killer = _wait_final(events, f"{prefix}-killer")
        _run_now(topics, f"{prefix}-flood")
        flood = _wait_final(events, f"{prefix}-flood")
        _run_now(topics, f"{prefix}-planter")
        assert _wait_final(events, f"{prefix}-planter").state == "succeeded"
        _run_now(topics, f"{prefix}-peeker")
        assert _wait_final(events, f"{prefix}-peeker").state == "succeeded"
        _run_now(topics, f"{prefix}-preload")
        _wait_final(events, f"{prefix}-preload")
        steady = _wait_final(events, f"{prefix}-steady")
        alive = worker.alive
    finally:
        events.close()
        worker.stop()
        node.stop()
    # Each attack is judged on its own (all that failed are said together).
    problems: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    # (4) The worker and the other owner's run outlived the hunt.
    check(alive, "the worker died")
    check(steady.state == "succeeded", f"the other owner's run: {steady.state} {steady.reason}")
    check("hunted" in _run_logs(topics, f"{prefix}-killer"), f"the killer: {killer.state}")
    # (10) Cut at the cap on disk, the run failed and says why.
    check(flood.state == "failed", f"the flood's run {flood.state}")
    check(
        "output cut: stdout passed the worker's output cap of 1 MiB" in flood.reason,
        f"the flood's reason: {flood.reason!r}",
    )
    runs = home.state / "workers" / worker.worker_id / "runs"
    found = [p for p in runs.rglob("stdout") if p.parent.parent.name.startswith(f"r{prefix}-flood")]
    sizes = [p.stat().st_size for p in found]
    check(
        bool(sizes) and set(sizes) == {CAP_MB * MIB},
        f"the flood's output on disk: {sizes} bytes",
    )
    # /tmp and /dev/shm of one run are not a later run's.
    peeked = _run_logs(topics, f"{prefix}-peeker").split()
    check(peeked == ["unseen"], f"the peeker saw {peeked}")
    check(not Path(f"/tmp/p-{tag}").exists(), "the planted file is in the host's /tmp")
    # (3) The owner's library ran in the job only, which found the secrets covered (own
    # user) or not its own (run-as); never in bwrap.
    shipped = _run_logs(topics, f"{prefix}-preload")
    check("preload-in:true" in shipped, f"the library did not run in the job: {shipped!r}")
    check("preload-in:bwrap" not in shipped, "the library ran in bwrap")
    check(home.marker not in shipped, "the library read the secret")
    if own_user:
        check("grab-denied" in shipped, f"the secret was not covered: {shipped!r}")
    Path(f"/tmp/p-{tag}").unlink(missing_ok=True)
    assert not problems, problems


def test_attacks_on_a_worker_that_runs_jobs_as_itself(topics: Settings, home: Home) -> None:
    python = _python_for_nobody()
    worker = WorkerProc(
        topics,
        "sb-own",
        home.logs,
        cpu=4,
        extra_env={
            "CRONLOG_STATE_DIR": str(home.state),
            "CRONLOG_SECRETS_DIR": str(home.secrets),
            "CRONLOG_WORKER_ALLOW_ROOT": "",
            "CRONLOG_WORKER_OUTPUT_CAP_MB": str(CAP_MB),
        },
    )
    worker.argv = [*AS_NOBODY, *python, "-m", "connectors.cli", *worker.args]
    _play(topics, worker, "sb-own", home, own_user=True)


def test_attacks_on_a_worker_that_runs_jobs_as_another_user(topics: Settings, home: Home) -> None:
    for path in (home.state, home.secrets, home.secrets / "probe"):
        os.chown(path, 0, 0)  # the worker's: root's
    worker = WorkerProc(
        topics,
        "sb-runas",
        home.logs,
        cpu=4,
        extra_env={
            "CRONLOG_STATE_DIR": str(home.state),
            "CRONLOG_SECRETS_DIR": str(home.secrets),
            "CRONLOG_WORKER_RUN_AS": "nobody",
            "CRONLOG_WORKER_OUTPUT_CAP_MB": str(CAP_MB),
        },
    )
    _play(topics, worker, "sb-runas", home, own_user=False)
