"""The worker process (`cronlog worker`).

Threads and processes, and why:
- the heartbeat thread sends a heartbeat every `heartbeat_s` (capacity, free resources,
  the attempts it holds) and, only once Kafka acknowledged it, renews the lease file;
- every run executes under its own supervisor process (connectors/supervise.py), in its
  own session, which kills the run when the lease expires: a worker that is paused,
  wedged or cut off stops its jobs before the failure detector declares it dead
  (lease 5 s after the last acknowledged heartbeat < 3 missed heartbeats + grace);
- the main loop reads worker-inbox (assignments, claim replies, cancel orders), claims
  through job-log, starts granted attempts, reports, and streams logs.

A run starts only after the ledger granted the claim, and at most once per attempt,
also across a restart with the same id (connectors/worker/journal.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson
from aiokafka.partitioner import murmur2
from confluent_kafka import Consumer, Producer, TopicPartition

from connectors.supervise import read_result, write_lease
from connectors.worker.journal import Journal
from schemas.codec import HEARTBEAT, JOB_LOG, RUN_LOG, WORKER_INBOX, CodecError
from schemas.json import from_plain, to_plain
from streams.core.ids import iso_utc
from streams.core.placement import Capacity, labels_match
from streams.core.records import (
    CancelOrder,
    ClaimReply,
    ClaimRequested,
    DispatchRequest,
    RunFinished,
    RunStarted,
    WorkerAssignment,
)
from streams.kafka import committed_or, consumer_config, producer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.worker")
Executor = Literal["process", "noop"]
CHUNK = 16 * 1024
MAX_LOG_BYTES = 1024 * 1024  # per (run, attempt, stream); the rest is dropped, and said so


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    worker_id: str
    capacity: Capacity
    labels: tuple[tuple[str, str], ...] = ()
    executor: Executor = "process"
    state_dir: Path = Path(".state/workers")
    heartbeat_s: float = 3.0
    # Runs are fenced when no beat was acknowledged for this long. It must end, with
    # fence_grace_s, before the failure detector's verdict (3 beats of 3 s + 1 s = 10 s).
    # 5 s left 2 s for an acknowledgement, and a CPU saturated by a burst of process
    # starts took up to 2.7 s: runs about to start were fenced. 7 s + 1 s leaves 2 s.
    lease_s: float = 7.0
    fence_grace_s: float = 1.0  # SIGTERM -> SIGKILL when fenced or timed out


@dataclass
class Attempt:
    dispatch: DispatchRequest
    phase: str  # claiming | granted | running | done
    run_dir: Path | None = None
    supervisor: subprocess.Popen[bytes] | None = None
    supervisor_pid: int | None = None
    reported_start: bool = False
    log_offsets: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    log_seq: dict[str, int] = field(default_factory=lambda: {"stdout": 0, "stderr": 0})
    cancelled: bool = False

    @property
    def key(self) -> tuple[str, int]:
        return self.dispatch.run_id, self.dispatch.attempt


class AttemptTable(dict[tuple[str, int], Attempt]):
    """The worker's attempts (none of them done: a finished attempt is removed), with
    the capacity they leave free kept up to date as they come and go. Summing over every
    attempt on each assignment was quadratic: 76% of a worker's CPU in a 10,000-run
    burst."""

    def __init__(self, capacity: Capacity):
        super().__init__()
        self.free = capacity

    def __setitem__(self, key: tuple[str, int], attempt: Attempt) -> None:
        old = self.get(key)
        if old is not None:
            self.free = self.free.plus(old.dispatch.resources)
        super().__setitem__(key, attempt)
        self.free = self.free.minus(attempt.dispatch.resources)

    def __delitem__(self, key: tuple[str, int]) -> None:
        attempt = self[key]
        super().__delitem__(key)
        self.free = self.free.plus(attempt.dispatch.resources)


def inbox_partition(worker_id: str, partitions: int) -> int:
    """The worker-inbox partition of `worker_id`: murmur2, as every producer uses."""
    return int(murmur2(worker_id.encode()) & 0x7FFFFFFF) % partitions


class Worker:
    def __init__(self, settings: Settings, config: WorkerConfig):
        self.settings = settings
        self.config = config
        self.dir = config.state_dir / config.worker_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lease = self.dir / "lease"
        self.journal = Journal(self.dir / "journal.jsonl")
        self.attempts = AttemptTable(config.capacity)
        # (free capacity, attempts held) for the heartbeat thread; the main loop, the
        # only one that touches `attempts`, replaces it after every pass.
        self.view: tuple[Capacity, tuple[tuple[str, int], ...]] = (config.capacity, ())
        self.stop_event = threading.Event()
        self.producer = Producer(producer_config(settings))
        self.topics = {
            n: settings.topic(n) for n in ("job-log", "heartbeats", "worker-inbox", "run-logs")
        }

    # -- capacity -------------------------------------------------------------------------
    def free(self) -> Capacity:
        return self.attempts.free

    # -- heartbeats and the lease -------------------------------------------------------------
    def heartbeat_loop(self) -> None:
        producer = Producer(producer_config(self.settings, **{"linger.ms": 0}))
        while not self.stop_event.is_set():
            started = time.monotonic()
            at_ms = int(time.time() * 1000)
            # The main loop's last published view: never wait for the main loop, which
            # may be busy for seconds (starting a hundred processes under a saturated
            # CPU). A beat that waited would renew the lease late and fence runs that are
            # about to start. A view a loop old is as good as any beat's snapshot: the
            # dispatcher keeps its reservations until a beat lists the attempt.
            free, running = self.view
            capacity = self.config.capacity
            beat = {
                "worker_id": self.config.worker_id,
                "at_ms": at_ms,
                "capacity": {
                    "cpu": capacity.cpu,
                    "memory_mb": capacity.memory_mb,
                    "gpu": capacity.gpu,
                },
                "free": {
                    "cpu": max(free.cpu, 0.0),
                    "memory_mb": max(free.memory_mb, 0),
                    "gpu": max(free.gpu, 0),
                },
                "labels": dict(self.config.labels),
                "running": [{"run_id": r, "attempt": a} for r, a in running],
            }
            delivered: list[bool] = []

            def acked(err: object, _msg: object, into: list[bool] = delivered) -> None:
                into.append(err is None)

            producer.produce(
                self.topics["heartbeats"],
                key=self.config.worker_id.encode(),
                value=HEARTBEAT.encode(beat),
                on_delivery=acked,
            )
            producer.flush(self.config.heartbeat_s)
            took = time.monotonic() - started
            if took > self.config.heartbeat_s / 2:
                log.warning("slow heartbeat: acknowledged after %.2f s", took)
            if delivered and delivered[0]:
                # Alive until lease_s after the beat was *made*: conservative.
                write_lease(self.lease, at_ms + int(self.config.lease_s * 1000))
            else:
                log.warning("heartbeat not acknowledged; the lease is not renewed")
            self.stop_event.wait(max(0.0, self.config.heartbeat_s - (time.monotonic() - started)))

    # -- main loop --------------------------------------------------------------------------
    def run(self) -> None:
        write_lease(self.lease, int(time.time() * 1000) + int(self.config.lease_s * 1000))
        self._recover()
        self._publish()
        beat = threading.Thread(target=self.heartbeat_loop, name="heartbeat", daemon=True)
        beat.start()
        consumer = Consumer(
            consumer_config(self.settings, self.settings.group(f"worker-{self.config.worker_id}"))
        )
        partition = inbox_partition(self.config.worker_id, self.settings.partitions)
        inbox = [TopicPartition(self.topics["worker-inbox"], partition)]
        consumer.assign(committed_or(consumer, inbox, stop=self.stop_event))
        log.info("worker %s ready (inbox partition %d)", self.config.worker_id, partition)
        try:
            while not self.stop_event.is_set():
                messages = consumer.consume(100, timeout=0.2)
                for msg in messages:
                    if msg.error() is None and msg.key() == self.config.worker_id.encode():
                        self._handle(msg.value() or b"")
                if messages:
                    # Replays after a crash are harmless (the journal and the attempt
                    # table ignore repeats); committing keeps them short.
                    consumer.commit(asynchronous=True)
                self._poll_attempts()
                self._publish()
                self.producer.poll(0)
        finally:
            self.stop_event.set()
            consumer.close()
            self.producer.flush(10)

    def stop(self) -> None:
        self.stop_event.set()

    def _publish(self) -> None:
        self.view = (self.free(), tuple(self.attempts))  # done attempts leave the table

    def _send(self, record: Any) -> None:
        self.producer.produce(
            self.topics["job-log"], key=record.job_id.encode(), value=JOB_LOG.encode(record)
        )

    def _handle(self, raw: bytes) -> None:
        try:
            message = WORKER_INBOX.decode(raw)
        except CodecError as exc:
            log.error("undecodable inbox record: %s", exc)
            return
        if isinstance(message, WorkerAssignment):
            self._assigned(message.dispatch)
        elif isinstance(message, ClaimReply):
            self._replied(message)
        elif isinstance(message, CancelOrder):
            self._cancel(message)

    def _assigned(self, dispatch: DispatchRequest) -> None:
        key = (dispatch.run_id, dispatch.attempt)
        if key in self.attempts or self.journal.phase(*key) is not None:
            return  # a repeated assignment: claimed or ran already
        if not self.free().fits(dispatch.resources) or not labels_match(
            dispatch.resources.labels, self.config.labels
        ):
            log.info("no room for %s#%d; leaving it to re-dispatch", *key)
            return
        self.attempts[key] = Attempt(dispatch, "claiming")
        self._send(
            ClaimRequested(
                dispatch.job_id,
                dispatch.run_id,
                dispatch.attempt,
                self.config.worker_id,
                int(time.time() * 1000),
            )
        )

    def _replied(self, reply: ClaimReply) -> None:
        attempt = self.attempts.get((reply.run_id, reply.attempt))
        if attempt is None or attempt.phase != "claiming":
            return
        if not reply.granted:
            del self.attempts[attempt.key]
            return
        d = attempt.dispatch
        self.journal.record(d.run_id, d.attempt, d.job_id, "granted", dispatch=to_plain(d))
        self._start(attempt)

    def _cancel(self, order: CancelOrder) -> None:
        attempt = self.attempts.get((order.run_id, order.attempt))
        if attempt is None:
            return
        attempt.cancelled = True
        if attempt.phase == "claiming":
            del self.attempts[attempt.key]
        elif attempt.supervisor_pid:
            _signal(attempt.supervisor_pid, signal.SIGTERM)  # the supervisor's "cancel"

    # -- execution ------------------------------------------------------------------------
    def _start(self, attempt: Attempt) -> None:
        d = attempt.dispatch
        if self.config.executor == "noop":
            attempt.phase = "running"
            return  # started by _poll_attempts at not_before
        run_dir = self.dir / "runs" / _safe(d.run_id) / str(d.attempt)
        run_dir.mkdir(parents=True, exist_ok=True)
        self.journal.record(d.run_id, d.attempt, d.job_id, "started", run_dir=str(run_dir))
        argv = [
            sys.executable,
            "-m",
            "connectors.supervise",
            "--run-dir",
            str(run_dir),
            "--lease-file",
            str(self.lease),
            "--timeout-s",
            str(d.timeout_s),
            "--grace-s",
            str(self.config.fence_grace_s),
            "--start-at-ms",
            str(d.not_before_ms),
        ]
        if d.resources.memory_mb > 0:
            argv += ["--memory-mb", str(d.resources.memory_mb)]
        with open(run_dir / "supervisor.log", "ab") as err:
            proc = subprocess.Popen(
                [*argv, "--", *d.command],
                env=self._env(d),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=err,
                start_new_session=True,
                cwd=run_dir,
            )
        (run_dir / "supervisor.pid").write_text(str(proc.pid))
        attempt.phase, attempt.run_dir = "running", run_dir
        attempt.supervisor, attempt.supervisor_pid = proc, proc.pid

    def _env(self, d: DispatchRequest) -> dict[str, str]:
        base = {
            k: v
            for k, v in os.environ.items()
            if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH")
        }
        return {
            **base,
            **dict(d.env),
            "CRONLOG_RUN_ID": d.run_id,
            "CRONLOG_JOB_ID": d.job_id,
            "CRONLOG_SCHEDULED_AT": iso_utc(d.scheduled_ms),
            "CRONLOG_ATTEMPT": str(d.attempt),
        }

    def _poll_attempts(self) -> None:
        now = int(time.time() * 1000)
        for attempt in list(self.attempts.values()):
            if attempt.phase != "running":
                continue
            if self.config.executor == "noop":
                if now >= attempt.dispatch.not_before_ms:
                    at = int(time.time() * 1000)  # per run: an honest start time
                    self._report_start(attempt, at)
                    self._report_finish(attempt, {"outcome": "exited", "exit_code": 0}, at)
                continue
            self._tail_logs(attempt)
            if attempt.supervisor is not None:
                attempt.supervisor.poll()  # reap it when it ends
            assert attempt.run_dir is not None
            started = attempt.run_dir / "started.json"
            if not attempt.reported_start and started.exists():
                info = orjson.loads(started.read_bytes())
                self._report_start(attempt, int(info["started_ms"]))
            result: dict[str, Any] | None = read_result(attempt.run_dir) or self._vanished(attempt)
            if result is not None:
                if not attempt.reported_start and result.get("started_ms"):
                    self._report_start(attempt, int(result["started_ms"]))
                self._tail_logs(attempt)
                if attempt.supervisor is not None:
                    attempt.supervisor.wait(10)  # it exits right after writing the result
                self._report_finish(attempt, result, int(result["finished_ms"]))

    def _vanished(self, attempt: Attempt) -> dict[str, Any] | None:
        """A supervisor that ended without writing a result (killed before it could,
        e.g. a cancel that arrived while it was starting): kill whatever it may have
        started and report the attempt, so its resources are not held forever."""
        if attempt.supervisor is not None:
            code = attempt.supervisor.poll()
            if code is None:
                return None
        elif attempt.supervisor_pid is not None and _alive(attempt.supervisor_pid):
            return None
        else:
            code = -1
        assert attempt.run_dir is not None
        started = attempt.run_dir / "started.json"
        if started.exists():
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.killpg(int(orjson.loads(started.read_bytes())["pgid"]), signal.SIGKILL)
        outcome = "cancelled" if attempt.cancelled else "error"
        return {
            "outcome": outcome,
            "exit_code": None,
            "finished_ms": int(time.time() * 1000),
            "error": f"the run's supervisor ended (status {code}) without a result",
        }

    def _report_start(self, attempt: Attempt, at_ms: int) -> None:
        d = attempt.dispatch
        attempt.reported_start = True
        self._send(RunStarted(d.job_id, d.run_id, d.attempt, self.config.worker_id, at_ms))

    def _report_finish(self, attempt: Attempt, result: dict[str, Any], at_ms: int) -> None:
        d = attempt.dispatch
        self._send(
            RunFinished(
                d.job_id,
                d.run_id,
                d.attempt,
                self.config.worker_id,
                _exit_code(result),
                _error(result),
                at_ms,
            )
        )
        self.journal.record(d.run_id, d.attempt, d.job_id, "reported")
        attempt.phase = "done"
        del self.attempts[attempt.key]

    def _tail_logs(self, attempt: Attempt) -> None:
        assert attempt.run_dir is not None
        for stream in ("stdout", "stderr"):
            path = attempt.run_dir / stream
            offset = attempt.log_offsets[stream]
            if offset >= MAX_LOG_BYTES or not path.exists() or path.stat().st_size <= offset:
                continue
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read(MAX_LOG_BYTES - offset)
                more = f.read(1) != b""
            for i in range(0, len(data), CHUNK):
                piece = data[i : i + CHUNK]
                last = i + CHUNK >= len(data)
                truncated = last and more and offset + len(data) >= MAX_LOG_BYTES
                self.producer.produce(
                    self.topics["run-logs"],
                    key=attempt.dispatch.run_id.encode(),
                    value=RUN_LOG.encode(
                        {
                            "run_id": attempt.dispatch.run_id,
                            "attempt": attempt.dispatch.attempt,
                            "stream": stream,
                            "seq": attempt.log_seq[stream],
                            "data": piece.decode(errors="replace"),
                            "truncated": truncated,
                            "worker_id": self.config.worker_id,
                            "at_ms": int(time.time() * 1000),
                        }
                    ),
                )
                attempt.log_seq[stream] += 1
            attempt.log_offsets[stream] = offset + len(data)

    # -- restart ----------------------------------------------------------------------------
    def _recover(self) -> None:
        """Adopt, report or declare lost what a previous incarnation left behind."""
        for entry in self.journal.unfinished():
            dispatch = from_plain(entry.info["dispatch"], DispatchRequest)
            attempt = Attempt(dispatch, "running")
            if entry.phase == "granted":
                # Granted but never started: start it now (once: the journal says so).
                self.attempts[attempt.key] = attempt
                self._start(attempt)
                continue
            run_dir = Path(entry.info["run_dir"])
            attempt.run_dir = run_dir
            pid_file = run_dir / "supervisor.pid"
            pid = int(pid_file.read_text()) if pid_file.exists() else None
            alive = pid is not None and _alive(pid)
            if read_result(run_dir) is not None or alive:
                attempt.supervisor_pid = pid
                self.attempts[attempt.key] = attempt  # adopt: poll will report it
            else:
                log.warning("lost %s#%d in a crash", *attempt.key)
                self._report_finish_lost(attempt)

    def _report_finish_lost(self, attempt: Attempt) -> None:
        d = attempt.dispatch
        self._send(
            RunFinished(
                d.job_id,
                d.run_id,
                d.attempt,
                self.config.worker_id,
                None,
                "lost: the worker restarted and the run's supervisor was gone",
                int(time.time() * 1000),
            )
        )
        self.journal.record(d.run_id, d.attempt, d.job_id, "reported")


def _exit_code(result: dict[str, Any]) -> int | None:
    code = result.get("exit_code")
    return int(code) if result.get("outcome") == "exited" and code is not None else None


def _error(result: dict[str, Any]) -> str:
    outcome = result.get("outcome")
    if outcome == "exited":
        sig = result.get("signal")
        return f"killed by signal {sig}" if sig else ""
    return {
        "timeout": "timed_out: killed after the timeout",
        "fenced": "fenced: the worker could not prove it was alive",
        "cancelled": "cancelled",
    }.get(str(outcome), f"error: {result.get('error', '')}")


def _safe(run_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
