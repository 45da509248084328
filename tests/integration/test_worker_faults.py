"""Worker faults with real processes: kill -9 of a worker mid-run (an idempotent run is
retried on another worker, a non-idempotent one ends failed: lost), and SIGSTOP past the
heartbeat timeout (the watchdog kills the job before the worker is declared dead; after
SIGCONT its stale report is rejected; no (run, attempt) ran twice)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from bench.common import _children
from connectors.worker.journal import FINISHED
from connectors.worker.worker import Worker, WorkerConfig
from schemas.codec import JOB_LOG, WORKER_INBOX
from schemas.records import ClaimReply, RunReleased
from streams.core.placement import Capacity
from streams.settings import Settings
from tests.support.nodes import (
    EventReader,
    Node,
    WorkerProc,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)
from tests.support.waiting import eventually, until_passes

REPORT = Path(__file__).resolve().parents[2] / ".state" / "reports" / "worker-faults.json"


@pytest.fixture(scope="module")
def cluster(
    topics: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Node, dict[str, WorkerProc]]]:
    logs = tmp_path_factory.mktemp("faults")
    node = Node(topics, "fault-n1", logs).start()
    workers = {w: WorkerProc(topics, w, logs, cpu=1, memory_mb=512).start() for w in ("wa", "wb")}
    yield node, workers
    stop_all([*workers.values(), node])


@pytest.fixture(scope="module")
def events(topics: Settings, cluster: object) -> Iterator[EventReader]:
    reader = EventReader(topics, "faults-check")
    yield reader
    reader.close()


def run_events(events: EventReader, run_id: str) -> list[tuple[int, str, str, str]]:
    return [(e.attempt, e.state, e.worker_id, e.reason) for e in runs_by_id(events).get(run_id, [])]


def wait_state(
    events: EventReader, run_id: str, state: str, timeout_s: float = 90, attempt: int | None = None
) -> tuple[int, str, str, str]:
    def found() -> tuple[int, str, str, str] | None:
        for item in run_events(events, run_id):
            if item[1] == state and (attempt is None or item[0] == attempt):
                return item
        return None

    events.wait_until(lambda: found() is not None, timeout_s, f"{run_id} {state}")
    result = found()
    assert result is not None
    return result


def alive(marker: str) -> bool:
    return subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False).returncode == 0


def record(**figures: object) -> None:
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(REPORT.read_text()) if REPORT.exists() else {}
    REPORT.write_text(json.dumps({**old, **figures}, indent=2))


def test_kill_9_mid_run(
    topics: Settings,
    cluster: tuple[Node, dict[str, WorkerProc]],
    events: EventReader,
    tmp_path: Path,
) -> None:
    _, workers = cluster
    marks = tmp_path / "starts.txt"
    command = ["sh", "-c", f'echo "$CRONLOG_RUN_ID $CRONLOG_ATTEMPT" >> {marks}; sleep 6']
    send_commands(
        topics,
        [
            job(
                "idem",
                command,
                idempotent=True,
                retry={"max_attempts": 3, "backoff_s": 1, "max_backoff_s": 2},
            ),
            job("nonidem", command),
        ],
    )
    events.wait_registered(["idem"])
    send_commands(topics, [{"type": "job.run_now", "job_id": "idem", "request_id": "k1"}])
    _, _, victim, _ = wait_state(events, "idem@manual:k1", "running")
    killed = time.time()
    workers[victim].kill()
    lost = wait_state(events, "idem@manual:k1", "retrying")
    assert "lost" in lost[3]
    detected_s = time.time() - killed
    again = wait_state(events, "idem@manual:k1", "succeeded", attempt=2)
    assert again[2] != victim  # retried on the other worker
    workers[victim].start()  # comes back with the same id and journal

    send_commands(topics, [{"type": "job.run_now", "job_id": "nonidem", "request_id": "k2"}])
    _, _, victim2, _ = wait_state(events, "nonidem@manual:k2", "running")
    workers[victim2].kill()
    failed = wait_state(events, "nonidem@manual:k2", "failed")
    assert failed[3].startswith("lost")
    workers[victim2].start()
    # The moment has passed once the restarted workers have reported what their killed
    # incarnations left behind (journaled once Kafka acknowledged it: their recovery of
    # those attempts is over, without a start) and `settle` has every run event those
    # reports cause in view: a second start needs a new dispatch by the ledger, which
    # would be there, after the final state.
    wait_journaled(workers[victim], "idem@manual:k1", 1, FINISHED, 60)
    wait_journaled(workers[victim2], "nonidem@manual:k2", 1, FINISHED, 60)
    events.settle()

    starts = marks.read_text().split("\n")
    attempts = [line for line in starts if line]
    assert len(attempts) == len(set(attempts)), "a (run, attempt) started twice"
    assert sorted(attempts) == ["idem@manual:k1 1", "idem@manual:k1 2", "nonidem@manual:k2 1"]
    for run_id in ("idem@manual:k1", "nonidem@manual:k2"):
        states = [s for _, s, _, _ in run_events(events, run_id)]
        assert states[-1] in ("succeeded", "failed")
        assert states.count(states[-1]) == 1  # nothing after the final state
    record(kill9_detection_s=round(detected_s, 2))


def test_sigstop_past_the_heartbeat_timeout(
    topics: Settings,
    cluster: tuple[Node, dict[str, WorkerProc]],
    events: EventReader,
    tmp_path: Path,
) -> None:
    _, workers = cluster
    marks = tmp_path / "starts.txt"
    send_commands(
        topics, [job("stopme", ["sh", "-c", f'echo "$CRONLOG_RUN_ID" >> {marks}; sleep 40.777'])]
    )
    events.wait_registered(["stopme"])
    send_commands(topics, [{"type": "job.run_now", "job_id": "stopme", "request_id": "s1"}])
    _, _, victim, _ = wait_state(events, "stopme@manual:s1", "running")
    assert alive("sleep 40.777")
    stopped = time.time()
    workers[victim].signal(signal.SIGSTOP)

    def job_killed() -> None:
        assert not alive("sleep 40.777"), "the watchdog did not kill the job"

    until_passes(job_killed, 30, interval_s=0.2)
    fenced_after_s = time.time() - stopped
    failed = wait_state(events, "stopme@manual:s1", "failed")
    declared_after_s = time.time() - stopped
    assert failed[3].startswith("lost")
    assert fenced_after_s < declared_after_s  # killed before being declared dead
    workers[victim].signal(signal.SIGCONT)
    # Its stale "fenced" report must change nothing: the moment has passed once the worker
    # journaled the report acknowledged and `settle` has every run event it causes in view.
    wait_journaled(workers[victim], "stopme@manual:s1", 1, FINISHED, 60)
    events.settle()
    states = [s for _, s, _, _ in run_events(events, "stopme@manual:s1")]
    assert states == ["due", "dispatched", "running", "failed"]
    assert marks.read_text().split() == ["stopme@manual:s1"]
    record(
        sigstop_job_killed_after_s=round(fenced_after_s, 2),
        sigstop_declared_dead_after_s=round(declared_after_s, 2),
    )


def executor_pid(worker: WorkerProc) -> int:
    """The live executor process of a worker (its lease file names the worker's folder)."""
    found = subprocess.run(
        ["pgrep", "-f", f"connectors.worker.engine --lease-file .*/{worker.worker_id}/lease"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert found, f"no executor for {worker.worker_id}"
    return max(int(pid) for pid in found)  # the newest, if an old one still drains


def claimed_ahead(
    topics: Settings, events: EventReader, job_id: str, marks: Path, in_s: float
) -> tuple[str, str]:
    """A one-off due `in_s` from now, claimed ahead (look-ahead): (run id, the worker)."""
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + in_s))
    command = ["sh", "-c", f'echo "$CRONLOG_RUN_ID $CRONLOG_ATTEMPT" >> {marks}']
    send_commands(topics, [job(job_id, command, schedule={"at": at})])
    events.wait_until(
        lambda: any(s == "dispatched" for _, s, _, _ in run_events(events, _run(events, job_id))),
        60,
        f"{job_id} claimed ahead",
    )
    run_id = _run(events, job_id)
    victim = next(w for _, s, w, _ in run_events(events, run_id) if s == "dispatched")
    return run_id, victim


def wait_journaled(
    worker: WorkerProc, run_id: str, attempt: int | None, phases: tuple[str, ...], timeout_s: float
) -> None:
    """Until `worker`'s journal has a line of `run_id` (`attempt`, if given) in one of
    `phases`."""
    journal = worker.log.parent / "state" / "workers" / worker.worker_id / "journal.jsonl"

    def journaled() -> None:
        lines = journal.read_bytes().splitlines() if journal.exists() else []
        for line in lines:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if (
                    entry["run_id"] == run_id
                    and attempt in (None, entry["attempt"])
                    and entry["phase"] in phases
                ):
                    return
        raise AssertionError(f"{worker.worker_id} never journaled {run_id} {phases}")

    until_passes(journaled, timeout_s, interval_s=0.1)


def wait_handed_to_executor(worker: WorkerProc, run_id: str, timeout_s: float = 30) -> None:
    """Until `worker` journaled `run_id` as handed to its executor ("started", fsynced
    before the hand-over): a kill after that leaves it to the executor, not to the claim
    (a kill between the grant and its processing is test_a_grant_the_journal_forgot...)."""
    wait_journaled(worker, run_id, None, ("started",), timeout_s)


def _run(events: EventReader, job_id: str) -> str:
    return next(
        (run_id for run_id, evs in runs_by_id(events).items() if evs[0].job_id == job_id), ""
    )


def test_restart_gives_back_runs_claimed_ahead_that_never_started(
    topics: Settings,
    cluster: tuple[Node, dict[str, WorkerProc]],
    events: EventReader,
    tmp_path: Path,
) -> None:
    """kill -9 of a worker holding a run claimed ahead, restarted at once: the old
    executor never starts it, the new incarnation gives it back, and it runs on time,
    once, as attempt 1 (it used to fail or wait for its claim deadline)."""
    _, workers = cluster
    marks = tmp_path / "starts.txt"
    run_id, victim = claimed_ahead(topics, events, "ahead1", marks, in_s=24)
    wait_handed_to_executor(workers[victim], run_id)
    workers[victim].kill()
    workers[victim].start()
    done = wait_state(events, run_id, "succeeded", timeout_s=90)
    assert done[0] == 1
    states = run_events(events, run_id)
    assert any(s == "due" and "released" in r for _, s, _, r in states), states
    assert marks.read_text().split("\n")[:-1] == [f"{run_id} 1"]


def test_worker_lost_before_the_start_dispatches_again(
    topics: Settings,
    cluster: tuple[Node, dict[str, WorkerProc]],
    events: EventReader,
    tmp_path: Path,
) -> None:
    """A worker killed for longer than the failure detector's verdict (10 s of silence)
    while it held a run claimed 34 s ahead: the verdict comes before the run's time, so
    the run is dispatched again (not failed: lost) and runs once, on the other worker."""
    _, workers = cluster
    marks = tmp_path / "starts.txt"
    run_id, victim = claimed_ahead(topics, events, "ahead2", marks, in_s=34)
    workers[victim].kill()
    try:
        done = wait_state(events, run_id, "succeeded", timeout_s=90)
    finally:
        workers[victim].start()
    assert done[0] == 1
    assert done[2] != victim
    states = run_events(events, run_id)
    assert not any(s in ("failed", "retrying") for _, s, _, _ in states), states
    assert marks.read_text().split("\n")[:-1] == [f"{run_id} 1"]


def test_a_machine_lost_for_good_fails_no_run_it_never_started(
    topics: Settings,
    cluster: tuple[Node, dict[str, WorkerProc]],
    events: EventReader,
    tmp_path: Path,
) -> None:
    """The worker and its executor killed at once (the machine is gone) 4 s before the
    start of a run it had claimed ahead: within the lease of its last beat (8 s), so the
    verdict could not tell whether it started and failed it `lost`. Its last
    acknowledged beat armed starts up to 2 s after it, so the run provably never
    started: it is dispatched again, with no attempt used, and runs once elsewhere."""
    _, workers = cluster
    for n in range(3):  # workers just started may claim the first one-off late
        marks = tmp_path / f"starts{n}.txt"
        due = float(int(time.time() + 20))  # the one-off's time has whole seconds
        run_id, victim = claimed_ahead(topics, events, f"lostmachine{n}", marks, in_s=20)
        if time.time() < due - 5:
            break
    assert time.time() < due - 5, "never claimed early enough to play the fault"
    time.sleep(max(0.0, due - 4 - time.time()))
    proc = workers[victim].proc
    assert proc is not None
    for pid in [*_children(proc.pid), proc.pid]:  # the executor too, and every job
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    workers[victim].kill()
    try:
        done = wait_state(events, run_id, "succeeded", timeout_s=90)
    finally:
        workers[victim].start()
    assert (done[0], done[2] != victim) == (1, True)
    states = run_events(events, run_id)
    assert not any(s in ("failed", "retrying") for _, s, _, _ in states), states
    assert any(s == "due" and "lost before the run's start" in r for _, s, _, r in states), states
    assert marks.read_text().split("\n")[:-1] == [f"{run_id} 1"]


def test_outcome_of_a_run_that_ended_while_the_worker_was_down_is_reported(
    topics: Settings,
    cluster: tuple[Node, dict[str, WorkerProc]],
    events: EventReader,
) -> None:
    """kill -9 of the worker mid-run; the job ends (exit 0) while the worker is down, within
    its lease; the restarted worker reads the outcome from the old executor's log and
    reports it: succeeded, not lost."""
    _, workers = cluster
    send_commands(topics, [job("endsalone", ["sh", "-c", "sleep 2.345; exit 0"])])
    events.wait_registered(["endsalone"])
    send_commands(topics, [{"type": "job.run_now", "job_id": "endsalone", "request_id": "e1"}])
    _, _, victim, _ = wait_state(events, "endsalone@manual:e1", "running")
    workers[victim].kill()
    # The job ends meanwhile (its process is gone); the lease (7 s) has not expired.
    eventually(lambda: not alive("sleep 2.345"), "the job to end while its worker is down", 6)
    workers[victim].start()
    done = wait_state(events, "endsalone@manual:e1", "succeeded", timeout_s=60)
    assert (done[0], done[2]) == (1, victim)


def test_a_killed_executor_is_replaced_and_its_jobs_killed(
    topics: Settings,
    cluster: tuple[Node, dict[str, WorkerProc]],
    events: EventReader,
) -> None:
    """kill -9 of the executor process mid-run: the worker kills the job's group, reports
    the attempt lost (a non-idempotent job fails: lost), starts a new executor, and the
    next run succeeds on the same worker."""
    _, workers = cluster
    send_commands(topics, [job("exekill", ["sh", "-c", "sleep 33.3; exit 0"])])
    events.wait_registered(["exekill"])
    send_commands(topics, [{"type": "job.run_now", "job_id": "exekill", "request_id": "x1"}])
    _, _, victim, _ = wait_state(events, "exekill@manual:x1", "running")
    assert alive("sleep 33.3")
    os.kill(executor_pid(workers[victim]), signal.SIGKILL)
    failed = wait_state(events, "exekill@manual:x1", "failed", timeout_s=30)
    assert "executor" in failed[3]
    assert not alive("sleep 33.3"), "the job outlived its executor"
    send_commands(topics, [job("after", ["true"])])
    events.wait_registered(["after"])
    send_commands(topics, [{"type": "job.run_now", "job_id": "after", "request_id": "x2"}])
    wait_state(events, "after@manual:x2", "succeeded", timeout_s=60)


def _released_reports(topics: Settings, worker: Worker) -> list[RunReleased]:
    """The releases `worker` produced (to worker-reports, read to its end)."""
    assert worker.producer.flush(30) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": topics.kafka,
            "group.id": topics.group("forgot-check"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    found: list[RunReleased] = []
    try:
        topic = topics.topic("worker-reports")
        consumer.assign([TopicPartition(topic, p, 0) for p in range(topics.partitions)])
        empty = 0
        while empty < 2:  # everything was acknowledged before: two idle seconds = the end
            batch = consumer.consume(1000, timeout=1.0)
            empty = 0 if batch else empty + 1
            for msg in batch:
                if msg.error() is None:
                    record = JOB_LOG.decode(msg.value() or b"")
                    if isinstance(record, RunReleased) and record.worker_id == "wforgot":
                        found.append(record)
    finally:
        consumer.close()
    return found


def test_a_grant_the_journal_forgot_is_given_back(topics: Settings, tmp_path: Path) -> None:
    """A worker killed after its claim left but before the claim's "claiming" line reached
    its journal comes back knowing nothing of the attempt; the grant, not yet committed in
    its inbox, is read again. The worker must give the attempt back (the ledger would
    otherwise hold it dispatched to this worker until the run's timeout), and must not give
    back an attempt it reported, nor act on a refusal."""
    config = WorkerConfig("wforgot", Capacity(1, 512, 0), state_dir=tmp_path, executor="noop")
    worker = Worker(topics, config)
    worker.journal.record("done@2026-12-01T00:00:00Z", 1, "done", "reported")
    for reply in (
        ClaimReply("wforgot", "forgot@2026-12-01T10:00:09Z", 1, True, "", 1),  # unknown
        ClaimReply("wforgot", "done@2026-12-01T00:00:00Z", 1, True, "", 2),  # reported
        ClaimReply("wforgot", "refused@2026-12-01T10:00:09Z", 1, False, "taken", 3),
    ):
        worker.handle_inbox_record(WORKER_INBOX.encode(reply))
    released = _released_reports(topics, worker)
    assert [(r.job_id, r.run_id, r.attempt) for r in released] == [
        ("forgot", "forgot@2026-12-01T10:00:09Z", 1)
    ]
    assert "earlier incarnation" in released[0].reason
