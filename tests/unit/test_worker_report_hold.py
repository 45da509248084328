"""A whole worker (its loop, heartbeat thread and reports) holding an ended run's report
while a run whose start time has come is not started yet (connectors/worker/report_hold.py),
on the in-memory Kafka (streams/memory.py) with an executor the test starts runs on: the
report waits, its attempt stays in the heartbeats, and it goes first once the burst is
started; a burst that never ends lets it go after `REPORT_HOLD_S`."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.worker.executor import Event, Executor, Finished, Key, Started, StartSpec
from connectors.worker.report_hold import REPORT_HOLD_S
from connectors.worker.worker import Worker, WorkerConfig
from schemas.codec import HEARTBEAT, JOB_LOG, WORKER_INBOX
from schemas.records import (
    ClaimReply,
    ClaimRequested,
    DispatchRequest,
    RunFinished,
    WorkerAssignment,
)
from schemas.spec import Resources
from streams.core.placement import Capacity
from streams.inboxes import private_inbox
from streams.kafka import producer_config
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=1)
WORKER = "whold"


class HandStartedExecutor:
    """An executor that starts a run only when the test says so: a burst it has not
    reached yet."""

    log_path = ""
    pid = 0
    output = False

    def __init__(self) -> None:
        self.handed: list[StartSpec] = []
        self._out: list[Event] = []
        self._lock = threading.Lock()

    def run(self, key: Key) -> None:
        """The run starts and exits 0 at once."""
        at, mono = int(time.time() * 1000), time.monotonic()
        with self._lock:
            self._out += [
                Started(key, 0, at, mono),
                Finished(key, "exited", 0, None, at, at, "", mono, mono),
            ]

    def start(self, spec: StartSpec) -> None:
        with self._lock:
            self.handed.append(spec)

    def cancel(self, key: Key) -> None:
        pass

    def events(self) -> list[Event]:
        with self._lock:
            out, self._out = self._out, []
        return out

    def health(self) -> str:
        return ""

    def kill(self) -> None:
        pass

    def close(self) -> None:
        pass


class HoldingWorker(Worker):
    def __init__(self, executor: HandStartedExecutor, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hand_started = executor

    def _new_executor(self) -> Executor:
        return self.hand_started


def _wait(check: Callable[[], Any], what: str, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"not within {timeout_s} s: {what}")


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[tuple[MemoryLog, HoldingWorker, HandStartedExecutor]]:
    log = MemoryLog()  # the system clock: the worker runs on its own threads
    log.create_catalogue(SETTINGS)
    inbox = private_inbox(SETTINGS, WORKER)
    assert inbox is not None
    log.create_topic(inbox, 1)
    executor = HandStartedExecutor()
    config = WorkerConfig(
        WORKER, Capacity(4, 1024, 0), state_dir=tmp_path, executor="noop", heartbeat_s=0.5
    )
    worker = HoldingWorker(executor, SETTINGS, config, clients=MemoryClients(log))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield log, worker, executor
    finally:
        worker.stop()
        thread.join(10)


def _reports(log: MemoryLog) -> list[Any]:
    topic = SETTINGS.topic("worker-reports")
    return [JOB_LOG.decode(m.value() or b"") for m in log.records(topic, committed=False)]


def _last_beat_keys(log: MemoryLog) -> set[tuple[str, int]]:
    beats = log.records(SETTINGS.topic("heartbeats"), committed=False)
    if not beats:
        return set()
    beat = HEARTBEAT.decode(beats[-1].value() or b"")
    return {(r.run_id, r.attempt) for r in beat.running}


def _start_two_due_now(log: MemoryLog, worker: Worker, executor: HandStartedExecutor) -> None:
    """Two runs assigned, claimed, granted and handed to the executor, due now."""
    _wait(lambda: worker.ready() is None and worker.broker.synced, "the worker ready")
    inbox = private_inbox(SETTINGS, WORKER)
    assert inbox is not None
    producer = MemoryClients(log).producer(producer_config(SETTINGS))
    now = int(time.time() * 1000)
    for name in ("a", "b"):
        d = DispatchRequest(
            f"{name}@1", name, 1, "o", ("true",), (), Resources(cpu=1), 60, 0, now, now, now
        )
        assignment = WorkerAssignment(WORKER, now, d)
        producer.produce(inbox, key=WORKER.encode(), value=WORKER_INBOX.encode(assignment))

    def both_claims() -> list[ClaimRequested]:
        claims = [r for r in _reports(log) if isinstance(r, ClaimRequested)]
        return claims if len(claims) == 2 else []

    claims = _wait(both_claims, "the two claims")
    for claim in claims:
        reply = ClaimReply(WORKER, claim.run_id, 1, True, "", claim.at_ms, claim.placement)
        producer.produce(inbox, key=WORKER.encode(), value=WORKER_INBOX.encode(reply))
    _wait(lambda: len(executor.handed) == 2, "both runs handed to the executor")


def _finished(log: MemoryLog) -> list[str]:
    return [r.run_id for r in _reports(log) if isinstance(r, RunFinished)]


def test_a_report_waits_while_a_due_run_is_not_started_then_goes_first(
    setup: tuple[MemoryLog, HoldingWorker, HandStartedExecutor],
) -> None:
    log, worker, executor = setup
    worker.hold.hold_s = 60.0  # its bound out of the way (the next test is about it)
    _start_two_due_now(log, worker, executor)
    executor.run(("a@1", 1))  # b, due too, is still waiting for the executor
    _wait(lambda: worker.hold.keys() == (("a@1", 1),), "a's report held")
    time.sleep(1.0)  # two heartbeats later, it is still held, and listed
    assert _finished(log) == []
    assert ("a@1", 1) in _wait(lambda: _last_beat_keys(log), "a heartbeat")
    executor.run(("b@1", 1))  # the burst is started: the held report goes, then b's
    assert _wait(lambda: len(_finished(log)) == 2 and _finished(log), "both reports") == [
        "a@1",
        "b@1",
    ]
    report = next(r for r in _reports(log) if isinstance(r, RunFinished))
    assert report.exit_code == 0
    assert report.started_ms is not None  # one report for its start and its end


def test_a_burst_that_never_ends_lets_a_held_report_go_after_its_bound(
    setup: tuple[MemoryLog, HoldingWorker, HandStartedExecutor],
) -> None:
    log, worker, executor = setup
    _start_two_due_now(log, worker, executor)
    executor.run(("a@1", 1))
    held = _wait(lambda: worker.hold.keys() == (("a@1", 1),) and time.monotonic(), "held")
    _wait(lambda: _finished(log) == ["a@1"], "a's report, b never started", REPORT_HOLD_S + 5)
    assert time.monotonic() - held >= REPORT_HOLD_S - 0.5
    assert not worker.hold
