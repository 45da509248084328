"""A hostile job against a real worker (issue 34, "The job boundary"): it cannot ship the
worker's files or environment through its output, cannot touch its output files by
name, and cannot stop the worker by putting a FIFO where its output was.

Each attack fails against the old worker: it opened `stdout`/`stderr` by name, as root,
in a directory the job owned (following a link to any file, blocking on a FIFO), and
mapped run ids to directories many-to-one.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from schemas.codec import RUN_LOG
from streams.kafka import consumer_config
from streams.settings import Settings
from tests.support.nodes import ROOT, EventReader, Node, WorkerProc, job, send_commands

FINALS = ("succeeded", "failed", "cancelled", "skipped")
NOBODY = pwd.getpwnam("nobody")
AS_NOBODY = ("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--")


@pytest.fixture
def secret() -> Iterator[tuple[Path, str]]:
    """A root-only file in a folder anyone may traverse, holding a marker."""
    folder = Path(f"/tmp/cronlog-secret-{uuid.uuid4().hex[:8]}")
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    marker = f"MARKER-{uuid.uuid4().hex}"
    path = folder / "secret"
    path.write_text(marker + "\n")
    path.chmod(0o600)
    try:
        yield path, marker
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_logs(settings: Settings, job_id: str) -> str:
    """Every run-logs chunk of `job_id`'s runs, as the API would show them."""
    consumer = Consumer(consumer_config(settings, None, **{"enable.partition.eof": True}))
    topic = settings.topic("run-logs")
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        text: list[str] = []
        ended: set[int] = set()
        while len(ended) < len(partitions):
            msg = consumer.poll(5)
            if msg is None:
                break
            value = msg.value()
            if msg.error() or value is None:
                ended.add(msg.partition() or 0)
                continue
            chunk = RUN_LOG.decode(value)
            if chunk.run_id.startswith(f"{job_id}@"):
                text.append(chunk.data)
        return "".join(text)
    finally:
        consumer.close()


def _final(events: EventReader, job_id: str) -> str | None:
    states = [e.state for e, _ in events.run_events() if e.job_id == job_id and e.state in FINALS]
    return states[0] if states else None


@pytest.mark.skipif(os.geteuid() != 0, reason="changing the jobs' user needs root")
def test_a_job_as_nobody_reaches_nothing_of_the_worker(
    topics: Settings, tmp_path: Path, secret: tuple[Path, str]
) -> None:
    path, marker = secret
    env_marker = f"ENV-{uuid.uuid4().hex}"
    # The job finds its output files where its own descriptors point, whatever the
    # layout (by a path relative to its working directory: the test's folders above the
    # worker's are root's alone), and tries to replace them.
    script = f"""
here=$(readlink /proc/$$/cwd)
near() {{ case "$1" in "$here"/*) echo "${{1#$here/}}";; *) echo "../$(basename "$1")";; esac; }}
out=$(near "$(readlink /proc/$$/fd/1)"); err=$(near "$(readlink /proc/$$/fd/2)")
ln -sf {path} "$out" 2>/dev/null && echo link-placed || echo link-denied
rm -f "$err" 2>/dev/null; mkfifo "$err" 2>/dev/null && echo fifo-placed || echo fifo-denied
cat {path} 2>/dev/null || echo secret-denied
cat /proc/$PPID/environ 2>/dev/null | tr '\\0' '\\n' | grep -c {env_marker}
for p in /proc/[0-9]*; do cat $p/environ 2>/dev/null; done | tr '\\0' '\\n' | grep -c {env_marker}
env | grep -c {env_marker}
echo done
"""
    node = Node(topics, "jb-n1", tmp_path).start()
    worker = WorkerProc(
        topics,
        "jb-w1",
        tmp_path,
        extra_env={"CRONLOG_WORKER_RUN_AS": "nobody", "CRONLOG_SECRET_PROBE": env_marker},
    ).start()
    events = EventReader(topics, "jb-events")
    try:
        send_commands(topics, [job("hostile", ["sh", "-c", script])])
        send_commands(topics, [{"type": "job.run_now", "job_id": "hostile", "request_id": "h1"}])
        events.wait_until(lambda: _final(events, "hostile") is not None, 90, "the hostile run")
        assert _final(events, "hostile") == "succeeded"
        assert worker.alive
    finally:
        events.close()
        worker.stop()
        node.stop()
    shipped = _run_logs(topics, "hostile")
    assert "done" in shipped  # its output was read and shipped
    assert marker not in shipped
    assert env_marker not in shipped
    outputs = sorted((tmp_path / "state").glob("workers/jb-w1/runs/*/*/stdout"))
    assert len(outputs) == 1
    stdout = outputs[0]
    for stream in (stdout, stdout.parent / "stderr"):
        assert not stream.is_symlink()
        assert stream.is_file()
    lines = stdout.read_text().split()
    assert lines == ["link-denied", "fifo-denied", "secret-denied", "0", "0", "0", "done"]
    assert marker not in (stdout.parent / "stderr").read_text()


def test_a_fifo_in_place_of_its_output_does_not_stop_the_worker(
    topics: Settings, tmp_path: Path
) -> None:
    """The job runs as the worker's own user (the default of this suite's workers), so
    it may replace its output file; the worker must neither block on what it finds
    there nor stop serving the other jobs."""
    node = Node(topics, "jf-n1", tmp_path).start()
    worker = WorkerProc(topics, "jf-w1", tmp_path, cpu=4).start()
    events = EventReader(topics, "jf-events")
    swap = (
        'out=$(readlink /proc/$$/fd/1); err=$(readlink /proc/$$/fd/2); rm "$out" "$err"; '
        'mkfifo "$out" "$err"; echo still-mine; sleep 12'
    )
    try:
        send_commands(
            topics,
            [
                job("steady", ["true"], schedule={"every": "1s"}),
                job("swapper", ["sh", "-c", swap], timeout_s=60),
            ],
        )
        events.wait_until(
            lambda: any(
                e.job_id == "steady" and e.state == "succeeded" for e, _ in events.run_events()
            ),
            90,
            "the steady job's first run",
        )
        send_commands(topics, [{"type": "job.run_now", "job_id": "swapper", "request_id": "s1"}])
        events.wait_until(lambda: _final(events, "swapper") is not None, 90, "the swapper's run")
        send_commands(topics, [{"type": "job.pause", "job_id": "steady"}])
        assert _final(events, "swapper") == "succeeded"
        assert worker.alive
        started = [
            w for e, w in events.run_events() if e.job_id == "swapper" and e.state == "running"
        ]
        ended = [w for e, w in events.run_events() if e.job_id == "swapper" and e.state in FINALS]
        # The steady job's runs went on while the FIFOs were there (its output is read
        # every second): a worker blocked on one would have claimed none of them.
        during = [
            w
            for e, w in events.run_events()
            if e.job_id == "steady" and e.state == "succeeded" and started[0] + 2000 < w < ended[0]
        ]
        assert len(during) >= 5, f"{len(during)} steady runs while the FIFOs were in place"
    finally:
        events.close()
        worker.stop()
        node.stop()


def _python_for_nobody() -> list[str]:
    """How `nobody` runs this checkout: this interpreter where it may execute it, else
    the system's interpreter of the same version (this suite's may live in root's home)
    on this environment's packages."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    path = os.pathsep.join([sysconfig.get_paths()["purelib"], str(ROOT)])
    for interpreter in (sys.executable, f"/usr/bin/{version}"):
        command = ["env", f"PYTHONPATH={path}", interpreter]
        probe = [*AS_NOBODY, *command, "-c", "import confluent_kafka, connectors.cli"]
        if subprocess.run(probe, capture_output=True, check=False, cwd="/").returncode == 0:
            return command
    pytest.skip(f"no {version} that nobody may run with this checkout's packages")


@pytest.mark.skipif(os.geteuid() != 0, reason="starting the worker as another user needs root")
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_job_of_the_workers_own_user_sees_none_of_its_files(topics: Settings) -> None:
    """A worker that cannot change users (here: started as `nobody`, no --run-as) runs
    its jobs as itself. Its state folder and secrets folder are then readable by the
    job's user; the job must still find nothing in them but its own working directory,
    and cannot lift what covers them from a namespace of its own."""
    home = Path(tempfile.mkdtemp(prefix="cronlog-own-user-"))
    home.chmod(0o755)
    state, secrets, logs = home / "state", home / "secrets", home / "logs"
    for folder in (state, secrets, logs):
        folder.mkdir()
    marker = f"MARKER-{uuid.uuid4().hex}"
    (secrets / "probe").write_text(marker + "\n")
    for path in (state, secrets, secrets / "probe"):
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
    script = f"""
here=$(pwd)
echo files=$(find {state} -type f 2>/dev/null | grep -vc "^$here/")
cat {secrets}/probe 2>/dev/null || echo secret-hidden
unshare -Urm sh -c 'umount -l {state}; umount -l {secrets}; find {state} {secrets} -type f' \
  2>/dev/null | grep -vc "^$here/" | sed 's/^/lifted=/'
echo mine > own && cat own
echo done
"""
    python = _python_for_nobody()
    node = Node(topics, "jo-n1", logs).start()
    worker = WorkerProc(
        topics,
        "jo-w1",
        logs,
        extra_env={
            "CRONLOG_STATE_DIR": str(state),
            "CRONLOG_SECRETS_DIR": str(secrets),
            "CRONLOG_WORKER_ALLOW_ROOT": "",
        },
    )
    worker.argv = [*AS_NOBODY, *python, "-m", "connectors.cli", *worker.args]
    worker.start()
    events = EventReader(topics, "jo-events")
    try:
        send_commands(topics, [job("curious", ["sh", "-c", script])])
        send_commands(topics, [{"type": "job.run_now", "job_id": "curious", "request_id": "c1"}])
        events.wait_until(lambda: _final(events, "curious") is not None, 90, "the curious run")
        assert _final(events, "curious") == "succeeded"
        assert worker.alive
        # What the job's user could read without the cover: the worker's own files.
        seen = subprocess.run(
            [*AS_NOBODY, "sh", "-c", f"find {state} -type f -path '*journal*' | xargs cat"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert seen.returncode == 0, seen.stderr
        assert "curious" in seen.stdout
    finally:
        events.close()
        worker.stop()
        node.stop()
    try:
        shipped = _run_logs(topics, "curious")
        assert shipped.split() == ["files=0", "secret-hidden", "lifted=0", "mine", "done"], shipped
    finally:
        shutil.rmtree(home, ignore_errors=True)
