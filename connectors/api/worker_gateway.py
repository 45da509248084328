"""Workers over HTTP: a worker written in any language heartbeats, acks (claims), and
reports started and finished through the API, which turns each call into exactly the
record a Kafka-native worker (connectors/worker) would produce.

The gateway follows `worker-inbox` from where it ended when the API started and keeps,
per worker that has heartbeated over HTTP recently, the assignments, claim replies and
stop orders addressed to it; a heartbeat's answer hands them over. Delivery is at least
once, in order:

- Each message's `seq` is its position in `worker-inbox` (offset + 1). A worker's messages
  all live in one partition (keyed by worker id, murmur2 like every producer), so seqs
  grow with the order the ledger and dispatchers wrote them in, are the same in every API
  process and survive a restart of the API: no epoch is needed.
- An answer carries the messages after the worker's `ack` (at most `MAX_ANSWER`, oldest
  first) and a top-level `seq`: the position the answer brings the worker to. The worker
  sends it back as `ack` in its next heartbeat, once it has handled the answer; only
  then are those messages removed. An answer that never arrives is simply given again,
  the same messages in the same order: a replay of a suffix, as a native worker sees
  after a restart from its committed offset.
- When a worker's inbox is not here (the API restarted, the worker was silent for
  `FORGET_AFTER_S`, or it used another API instance until now), a heartbeat with
  `ack > 0` rebuilds it by reading the worker's partition from `ack` (at most
  `REPLAY_S` back): nothing sent while no API held its inbox is lost. An ack beyond
  the partition's end (the topic was recreated) is ignored.
- A heartbeat without `ack` is the older protocol: what the answer carries is removed at
  once (at most once: a lost answer loses its messages), and the answer has no `seq`.
  A worker speaking this protocol sends `ack: 0` on its first heartbeat.
- An inbox holds at most `MAX_PENDING` messages; a worker that never acks loses the
  oldest, with a log line. An inbox silent for `FORGET_AFTER_S` is forgotten.

The HTTP worker is responsible for what the native worker does itself: not starting
before its claim is granted, killing its process on a stop order, handling every message
in seq order and a repeated one harmlessly, and heartbeating every second, at least
every 2 s (the timing budget, streams/core/timing.py: silent for 4 s it is suspected
and its unclaimed assignments are placed elsewhere, for 11 s it is declared dead).
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_END,
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from connectors.api.service import Principal, Service, ServiceError
from schemas.codec import HEARTBEAT, JOB_LOG, WORKER_INBOX, CodecError
from schemas.json import to_plain
from schemas.records import (
    ClaimReply,
    ClaimRequested,
    Heartbeat,
    RunFinished,
    RunningAttempt,
    RunReleased,
    RunStarted,
    WorkerAssignment,
    WorkerCapacity,
    WorkerMessage,
)
from streams.core.ids import parse_run_id
from streams.core.seals import SEAL_CHARS
from streams.kafka import admin_config, consumer_config, partition_for

log = logging.getLogger("cronlog.api.workers")


def inbox_partition(worker_id: str, partitions: int) -> int:
    """The shared worker-inbox partition of an HTTP worker (keyed by its id, like every
    producer): native workers read their own topic instead (streams/inboxes.py)."""
    return partition_for(worker_id, partitions)


FORGET_AFTER_S = 60.0  # a worker silent this long gets no more buffering
MAX_PENDING = 10_000  # per worker: a worker that never acks must not grow the API for ever
MAX_ANSWER = 1_000  # messages per heartbeat answer; the rest come with the next one
REPLAY_S = 300.0  # a rebuilt inbox reads worker-inbox at most this far back
REPLAY_TIMEOUT_S = 10.0
MAX_SEQ = 2**63 - 1
MAX_SEALS = 100_000  # placement seals remembered for reports that do not carry theirs
KINDS = ("assignments", "grants", "kills")


class _BeyondEnd(Exception):
    """An ack past the end of the worker's worker-inbox partition."""


@dataclass
class _Inbox:
    """One HTTP worker's inbox as this API holds it: its messages by seq, up to its ack."""

    partition: int
    seen: float = field(default_factory=time.monotonic)
    acked: int = 0  # the worker has handled every message up to this seq
    seqs: list[int] = field(default_factory=list)  # ascending
    items: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    dropped: int = 0
    # Set once the inbox may be answered from (a rebuild from worker-inbox is done).
    ready: threading.Event = field(default_factory=threading.Event)
    failed: bool = False

    def add(self, worker_id: str, seq: int, kind: str, item: dict[str, Any], limit: int) -> None:
        if seq <= self.acked or seq in self.items:
            return  # handled already, or both replayed and followed
        bisect.insort(self.seqs, seq)
        self.items[seq] = (kind, item)
        while len(self.seqs) > limit:
            oldest = self.seqs.pop(0)
            lost, _ = self.items.pop(oldest)
            self.dropped += 1
            if self.dropped % 1000 == 1:
                log.warning(
                    "worker %s has %d unacknowledged messages: dropped the oldest "
                    "(seq %d, %s); %d dropped so far",
                    worker_id,
                    limit,
                    oldest,
                    lost,
                    self.dropped,
                )

    def ack(self, upto: int) -> None:
        self.acked = max(self.acked, upto)
        cut = bisect.bisect_right(self.seqs, upto)
        for seq in self.seqs[:cut]:
            del self.items[seq]
        del self.seqs[:cut]


def _item(message: WorkerMessage) -> tuple[str, dict[str, Any]]:
    """What an HTTP worker receives for an inbox message: its list and its JSON form."""
    if isinstance(message, WorkerAssignment):
        return "assignments", to_plain(message.dispatch)
    if isinstance(message, ClaimReply):
        return "grants", {
            "run_id": message.run_id,
            "attempt": message.attempt,
            "granted": message.granted,
            "reason": message.reason,
            "placement": message.placement,
        }
    # a CancelOrder: a stop order
    return "kills", {"run_id": message.run_id, "attempt": message.attempt, "reason": message.reason}


def _number(doc: dict[str, Any], key: str, kind: type, minimum: float = 0) -> Any:
    value = doc.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ServiceError(422, f"{key} must be a number", key)
    if value < minimum:
        raise ServiceError(422, f"{key} must be >= {minimum}", key)
    return kind(value)


def _capacity(doc: object, where: str) -> WorkerCapacity:
    if not isinstance(doc, dict):
        raise ServiceError(422, f"{where} must be an object with cpu, memory_mb, gpu", where)
    return WorkerCapacity(
        _number(doc, "cpu", float), _number(doc, "memory_mb", int), _number(doc, "gpu", int)
    )


def _attempt(body: dict[str, Any]) -> int:
    value = body.get("attempt")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServiceError(422, "attempt must be an integer >= 1", "attempt")
    return value


def _ack(body: dict[str, Any]) -> int | None:
    value = body.get("ack")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SEQ:
        raise ServiceError(422, "ack must be the integer seq of the last answer handled", "ack")
    return value


class WorkerGateway:
    def __init__(self, service: Service):
        self.service = service
        self.settings = service.settings
        self.inboxes: dict[str, _Inbox] = {}
        # Per worker-inbox partition: the follower has read everything before this seq.
        self.positions: dict[int, int] = {}
        self.max_pending = MAX_PENDING
        # The seals of the attempts placed on HTTP workers, by (worker, run, attempt), as
        # their assignments and grants carried them: a report without its `placement`
        # (the protocol before seals) gets it from here, oldest forgotten first.
        self.seals: OrderedDict[tuple[str, str, int], str] = OrderedDict()
        self.max_answer = MAX_ANSWER
        self.starts: dict[int, int] = {}  # where the follower starts, per partition
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._follow, name="worker-inbox", daemon=True)
        self.follows = threading.Event()  # set once the follower's start is fixed

    def start(self) -> None:
        """Fix where worker-inbox ends now (read_committed) before any heartbeat is
        served: the follower starts there, so that a message written once this returns
        reaches the inboxes however late the follower's first fetch is."""
        self.starts = self._ends()
        if self.starts:
            self._following()
        # Otherwise Kafka is down: the follower asks again until it answers, and until
        # then heartbeats answer 503 (a message written meanwhile must not be missed).
        self.thread.start()

    def _following(self) -> None:
        with self.lock:
            self.positions.update(self.starts)
        self.follows.set()

    def _ends(self) -> dict[int, int]:
        topic = self.settings.topic("worker-inbox")
        admin = AdminClient(admin_config(self.settings))
        try:
            latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
            futures = admin.list_offsets(
                {TopicPartition(topic, p): latest for p in range(self.settings.partitions)},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=10,
            )
            return {tp.partition: future.result().offset for tp, future in futures.items()}
        except KafkaException as exc:
            log.warning("Kafka unreachable: cannot find where worker-inbox ends (%s)", exc)
            return {}

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(10)

    # -- following worker-inbox -------------------------------------------------------------
    def _follow(self) -> None:
        while not self.starts:
            log.warning("waiting for Kafka before following worker-inbox")
            if self._stop.wait(2.0):
                return
            self.starts = self._ends()
        if not self.follows.is_set():
            log.warning("Kafka is back: following worker-inbox")
            self._following()
        # Reconnect to a broker that is down every second, not up to every 10 s.
        consumer = Consumer(
            consumer_config(self.settings, None, **{"reconnect.backoff.max.ms": 1000})
        )
        topic = self.settings.topic("worker-inbox")
        consumer.assign(
            [
                TopicPartition(topic, p, self.starts.get(p, OFFSET_END))
                for p in range(self.settings.partitions)
            ]
        )
        swept = time.monotonic()
        try:
            while not self._stop.is_set():
                for msg in consumer.consume(500, timeout=0.5):
                    error = msg.error()
                    if error is None:
                        self.deliver(msg.partition() or 0, msg.offset() or 0, msg.value())
                    else:
                        log.warning("following worker-inbox: %s", error)
                if time.monotonic() - swept > 5:
                    swept = time.monotonic()
                    self._sweep()
        finally:
            consumer.close()

    def _sweep(self) -> None:
        """Forget the inboxes of workers silent for FORGET_AFTER_S (what they held is
        still in worker-inbox, for a rebuild should they come back with an ack)."""
        now = time.monotonic()
        with self.lock:
            for worker_id, box in list(self.inboxes.items()):
                if box.ready.is_set() and now - box.seen > FORGET_AFTER_S:
                    del self.inboxes[worker_id]

    def deliver(self, partition: int, offset: int, raw: bytes | None) -> None:
        """Take one worker-inbox record (`raw` at `offset` of `partition`) into its worker's
        inbox and advance the follower's position; the follower calls it for each record
        read, and tests/integration/test_http_worker_ack.py feeds an inbox with it."""
        message: WorkerMessage | None = None
        if raw:
            try:
                message = WORKER_INBOX.decode(raw)
            except CodecError as exc:
                log.error("undecodable worker-inbox record: %s", exc)
        with self.lock:
            self.positions[partition] = max(offset + 1, self.positions.get(partition, 0))
            if message is None:
                return
            box = self.inboxes.get(message.worker_id)
            if box is None or time.monotonic() - box.seen > FORGET_AFTER_S:
                return  # not an HTTP worker (or one long gone)
            kind, item = _item(message)
            box.add(message.worker_id, offset + 1, kind, item, self.max_pending)
            self._remember(message)

    def _remember(self, message: WorkerMessage) -> None:
        """Keep the seal a message carries (the caller holds the lock)."""
        if isinstance(message, WorkerAssignment):
            d = message.dispatch
            key, seal = (message.worker_id, d.run_id, d.attempt), d.placement
        elif isinstance(message, ClaimReply) and message.placement:
            key, seal = (message.worker_id, message.run_id, message.attempt), message.placement
        else:
            return
        self.seals[key] = seal
        self.seals.move_to_end(key)
        while len(self.seals) > MAX_SEALS:
            self.seals.popitem(last=False)

    def _replay(self, worker_id: str, partition: int, ack: int) -> list[tuple[int, WorkerMessage]]:
        """The worker's messages in its worker-inbox partition from seq `ack` on (at most
        REPLAY_S old), up to the partition's end; an empty list for an ack beyond it."""
        topic = self.settings.topic("worker-inbox")
        key = worker_id.encode()
        reader = Consumer(
            consumer_config(
                self.settings, None, **{"enable.partition.eof": True, "fetch.wait.max.ms": 20}
            )
        )
        found: list[tuple[int, WorkerMessage]] = []
        try:
            low, high = reader.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
            if ack > high:
                log.warning(
                    "worker %s acked seq %d, beyond the end of worker-inbox partition %d "
                    "(%d): ignored",
                    worker_id,
                    ack,
                    partition,
                    high,
                )
                raise _BeyondEnd
            since_ms = int((time.time() - REPLAY_S) * 1000)
            (first,) = reader.offsets_for_times(
                [TopicPartition(topic, partition, since_ms)], timeout=5
            )
            start = max(ack, low, first.offset if first.offset >= 0 else high)
            if start > ack:
                log.warning(
                    "worker %s acked seq %d; its messages before seq %d (older than %.0f s) "
                    "are not replayed",
                    worker_id,
                    ack,
                    start,
                    REPLAY_S,
                )
            if start >= high:
                return found
            reader.assign([TopicPartition(topic, partition, start)])
            deadline = time.monotonic() + REPLAY_TIMEOUT_S
            while time.monotonic() < deadline:
                for msg in reader.consume(1000, timeout=0.2):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            return found
                        raise KafkaException(error)
                    if msg.key() != key or not msg.value():
                        continue
                    try:
                        message = WORKER_INBOX.decode(msg.value() or b"")
                    except CodecError:
                        continue  # the follower logs it
                    if message.worker_id == worker_id:
                        found.append(((msg.offset() or 0) + 1, message))
                (position,) = reader.position([TopicPartition(topic, partition)])
                if position.offset >= high:
                    return found
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "worker-inbox replay"))
        finally:
            reader.close()

    def _inbox(self, worker_id: str, ack: int | None) -> tuple[_Inbox, int | None]:
        """The worker's inbox, made (and rebuilt from worker-inbox after `ack`) if this
        API holds none for it; the ack applied. Returns the ack to answer with (0 if it
        was ignored as beyond the partition's end)."""
        with self.lock:
            box = self.inboxes.get(worker_id)
            if box is not None and box.ready.is_set() and box.failed:
                box = None
            if box is not None and time.monotonic() - box.seen > FORGET_AFTER_S:
                box = None  # it stopped buffering: make it again
            made = box is None
            if box is None:
                box = _Inbox(inbox_partition(worker_id, self.settings.partitions))
                self.inboxes[worker_id] = box
                if not ack:
                    box.ready.set()  # from now on: nothing before was this worker's
            box.seen = time.monotonic()
        if made and ack:
            try:
                replayed = self._replay(worker_id, box.partition, ack)
            except _BeyondEnd:
                ack, replayed = 0, []  # as if it had handled nothing
            except KafkaException as exc:
                with self.lock:
                    box.failed = True
                    if self.inboxes.get(worker_id) is box:
                        del self.inboxes[worker_id]
                box.ready.set()
                raise ServiceError(503, f"could not read worker-inbox: {exc}") from exc
            with self.lock:
                for seq, message in replayed:
                    kind, item = _item(message)
                    box.add(worker_id, seq, kind, item, self.max_pending)
                    self._remember(message)
            box.ready.set()
        elif not box.ready.wait(3 * REPLAY_TIMEOUT_S) or box.failed:
            raise ServiceError(503, "this worker's inbox is being rebuilt; try again")
        if ack is not None:
            with self.lock:
                box.ack(ack)
        return box, ack

    def answer(self, box: _Inbox, ack: int | None) -> dict[str, Any]:
        """The messages a heartbeat answer carries from `box` (at most `max_answer`) and the
        seq they acknowledge, given the worker's `ack` (None: the older protocol); for
        `heartbeat`, and the inbox tests of tests/integration/test_http_worker_ack.py."""
        answer: dict[str, Any] = {kind: [] for kind in KINDS}
        with self.lock:
            given = box.seqs[: self.max_answer]
            for seq in given:
                kind, item = box.items[seq]
                answer[kind].append({**item, "seq": seq})
            if ack is None:
                # The older protocol: handed over means gone, and the answer keeps its
                # three keys only (clients iterate over them).
                box.ack(given[-1] if given else 0)
            elif len(given) < len(box.seqs):
                answer["seq"] = given[-1]  # more to come: ack up to what was given
            else:
                # Every message of this worker before the follower's position is in the
                # box, was acked, or (before the box existed) was never this box's.
                answer["seq"] = max(
                    given[-1] if given else 0,
                    self.positions.get(box.partition, 0),
                    box.acked,
                    ack,
                )
        return answer

    # -- the endpoints' work ----------------------------------------------------------------
    @staticmethod
    def check(who: Principal, worker_id: str) -> None:
        if who.kind == "admin" or (who.kind == "worker" and who.name == worker_id):
            return
        raise ServiceError(403, f"this token may not act as worker {worker_id!r}")

    def heartbeat(self, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        capacity = _capacity(body.get("capacity"), "capacity")
        free = _capacity(body.get("free", body.get("capacity")), "free")
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
        ack = _ack(body)
        if not self.follows.is_set():
            raise ServiceError(503, "Kafka is unavailable: the API is waiting for the broker")
        beat = Heartbeat(
            worker_id,
            int(time.time() * 1000),
            capacity,
            free,
            tuple(sorted(labels.items())),
            tuple(RunningAttempt(r["run_id"], _attempt(r)) for r in running),
        )
        box, ack = self._inbox(worker_id, ack)
        self.service.produce("heartbeats", worker_id, HEARTBEAT.encode(beat))
        return self.answer(box, ack)

    def report(self, worker_id: str, run_id: str, kind: str, body: dict[str, Any]) -> None:
        parts = parse_run_id(run_id)
        if parts is None or not parts.job_id:
            raise ServiceError(422, f"{run_id!r} is not a run id", "run_id")
        job_id = parts.job_id
        attempt = _attempt(body)
        now = int(time.time() * 1000)
        record: ClaimRequested | RunStarted | RunFinished | RunReleased
        # The assignment's seal, sent back as it came: the ledger grants the claim, and
        # takes the reports, only from the worker the attempt was placed on
        # (streams/core/seals.py). An ack carries it (the assignment is at hand); a later
        # report without it (the protocol before seals) gets the one this API delivered.
        placement = body.get("placement", "")
        if not isinstance(placement, str) or len(placement) > SEAL_CHARS:
            raise ServiceError(
                422, "placement must be the assignment's placement string", "placement"
            )
        if not placement and kind != "ack":
            with self.lock:
                placement = self.seals.get((worker_id, run_id, attempt), "")
        if kind == "ack":
            record = ClaimRequested(job_id, run_id, attempt, worker_id, now, placement)
        elif kind == "started":
            record = RunStarted(job_id, run_id, attempt, worker_id, now, placement)
        elif kind == "released":
            reason = body.get("reason", "")
            if not isinstance(reason, str):
                raise ServiceError(422, "reason must be a string", "reason")
            record = RunReleased(job_id, run_id, attempt, worker_id, reason[:2000], now, placement)
        else:
            exit_code = body.get("exit_code")
            if exit_code is not None and (
                isinstance(exit_code, bool) or not isinstance(exit_code, int)
            ):
                raise ServiceError(422, "exit_code must be an integer or null", "exit_code")
            error = body.get("error", "")
            if not isinstance(error, str):
                raise ServiceError(422, "error must be a string", "error")
            record = RunFinished(
                job_id, run_id, attempt, worker_id, exit_code, error[:2000], now, placement
            )
        self.service.produce("worker-reports", job_id, JOB_LOG.encode(record))
