"""Workers over HTTP: a worker written in any language heartbeats, acks (claims), and
reports started and finished through the API, which turns each call into exactly the
record a Kafka-native worker (connectors/worker) would produce.

The gateway follows `worker-inbox` from its end and keeps, per worker that has
heartbeated over HTTP recently, the assignments, claim replies and stop orders addressed
to it; a heartbeat's answer hands them over. What the gateway holds lives in memory: if
the API restarts, messages in flight are lost — the ledger copes as with a worker that
never answered (an unclaimed dispatch is re-placed after its claim deadline; an
unanswered claim is retried by the worker's next ack).

The HTTP worker is responsible for what the native worker does itself: not starting
before its claim is granted, killing its process on a stop order, and heartbeating at
least every 3 s (otherwise the dispatcher suspects it, then declares it dead).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, TopicPartition

from connectors.api.service import Principal, Service, ServiceError
from schemas.codec import HEARTBEAT, JOB_LOG, WORKER_INBOX, CodecError
from schemas.json import to_plain
from streams.core.records import (
    CancelOrder,
    ClaimReply,
    ClaimRequested,
    RunFinished,
    RunReleased,
    RunStarted,
    WorkerAssignment,
)
from streams.kafka import consumer_config

log = logging.getLogger("cronlog.api.workers")
FORGET_AFTER_S = 60.0  # a worker silent this long gets no more buffering
MAX_PENDING = 1000  # per worker: a stuck worker must not grow the API without bound


@dataclass
class _Mailbox:
    seen: float = field(default_factory=time.monotonic)
    assignments: list[dict[str, Any]] = field(default_factory=list)
    grants: list[dict[str, Any]] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, item: dict[str, Any]) -> None:
        box: list[dict[str, Any]] = getattr(self, kind)
        if len(box) < MAX_PENDING:
            box.append(item)


def _number(doc: dict[str, Any], key: str, kind: type, minimum: float = 0) -> Any:
    value = doc.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ServiceError(422, f"{key} must be a number", key)
    if value < minimum:
        raise ServiceError(422, f"{key} must be >= {minimum}", key)
    return kind(value)


def _capacity(doc: object, where: str) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise ServiceError(422, f"{where} must be an object with cpu, memory_mb, gpu", where)
    return {
        "cpu": _number(doc, "cpu", float),
        "memory_mb": _number(doc, "memory_mb", int),
        "gpu": _number(doc, "gpu", int),
    }


def _attempt(body: dict[str, Any]) -> int:
    value = body.get("attempt")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServiceError(422, "attempt must be an integer >= 1", "attempt")
    return value


class WorkerGateway:
    def __init__(self, service: Service):
        self.service = service
        self.settings = service.settings
        self.boxes: dict[str, _Mailbox] = defaultdict(_Mailbox)
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="worker-inbox", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)

    # -- following worker-inbox -------------------------------------------------------------
    def _follow(self) -> None:
        consumer = Consumer(consumer_config(self.settings, None))
        topic = self.settings.topic("worker-inbox")
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_END) for p in range(self.settings.partitions)]
        )
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is None and msg.value():
                        self._deliver(msg.value() or b"")
        finally:
            consumer.close()

    def _deliver(self, raw: bytes) -> None:
        try:
            message = WORKER_INBOX.decode(raw)
        except CodecError as exc:
            log.error("undecodable worker-inbox record: %s", exc)
            return
        with self.lock:
            box = self.boxes.get(message.worker_id)
            if box is None or time.monotonic() - box.seen > FORGET_AFTER_S:
                return  # not an HTTP worker (or one long gone)
            if isinstance(message, WorkerAssignment):
                box.add("assignments", to_plain(message.dispatch))
            elif isinstance(message, ClaimReply):
                box.add(
                    "grants",
                    {
                        "run_id": message.run_id,
                        "attempt": message.attempt,
                        "granted": message.granted,
                        "reason": message.reason,
                    },
                )
            elif isinstance(message, CancelOrder):
                box.add(
                    "kills",
                    {
                        "run_id": message.run_id,
                        "attempt": message.attempt,
                        "reason": message.reason,
                    },
                )

    # -- the endpoints' work ----------------------------------------------------------------
    @staticmethod
    def check(who: Principal, worker_id: str) -> None:
        if who.kind == "admin" or (who.kind == "worker" and who.name in (worker_id, "*")):
            return
        raise ServiceError(403, f"this token may not act as worker {worker_id!r}")

    def heartbeat(self, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        capacity = _capacity(body.get("capacity"), "capacity")
        free = _capacity(body.get("free", capacity), "free")
        labels = body.get("labels", {})
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise ServiceError(422, "labels must map strings to strings", "labels")
        running = body.get("running", [])
        if not isinstance(running, list) or not all(
            isinstance(r, dict) and isinstance(r.get("run_id"), str) for r in running
        ):
            raise ServiceError(422, "running must be a list of {run_id, attempt}", "running")
        beat = {
            "worker_id": worker_id,
            "at_ms": int(time.time() * 1000),
            "capacity": capacity,
            "free": free,
            "labels": labels,
            "running": [{"run_id": r["run_id"], "attempt": _attempt(r)} for r in running],
        }
        with self.lock:
            box = self.boxes[worker_id]
            box.seen = time.monotonic()
        self.service.produce("heartbeats", worker_id, HEARTBEAT.encode(beat))
        with self.lock:
            box = self.boxes[worker_id]
            answer = {"assignments": box.assignments, "grants": box.grants, "kills": box.kills}
            self.boxes[worker_id] = _Mailbox()
        return answer

    def report(self, worker_id: str, run_id: str, kind: str, body: dict[str, Any]) -> None:
        job_id, at, _ = run_id.partition("@")
        if not at or not job_id:
            raise ServiceError(422, f"{run_id!r} is not a run id", "run_id")
        attempt = _attempt(body)
        now = int(time.time() * 1000)
        record: ClaimRequested | RunStarted | RunFinished | RunReleased
        if kind == "ack":
            record = ClaimRequested(job_id, run_id, attempt, worker_id, now)
        elif kind == "started":
            record = RunStarted(job_id, run_id, attempt, worker_id, now)
        elif kind == "released":
            reason = body.get("reason", "")
            if not isinstance(reason, str):
                raise ServiceError(422, "reason must be a string", "reason")
            record = RunReleased(job_id, run_id, attempt, worker_id, reason[:2000], now)
        else:
            exit_code = body.get("exit_code")
            if exit_code is not None and (
                isinstance(exit_code, bool) or not isinstance(exit_code, int)
            ):
                raise ServiceError(422, "exit_code must be an integer or null", "exit_code")
            error = body.get("error", "")
            if not isinstance(error, str):
                raise ServiceError(422, "error must be a string", "error")
            record = RunFinished(job_id, run_id, attempt, worker_id, exit_code, error[:2000], now)
        self.service.produce("job-log", job_id, JOB_LOG.encode(record))
