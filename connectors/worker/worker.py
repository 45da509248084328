"""The worker process (`cronlog worker`).

Its parts, and why:
- the heartbeat thread (connectors/worker/heartbeat.py) advertises capacity and renews
  the lease only after Kafka acknowledged a beat;
- the executor (connectors/worker/executor.py, engine.py), one long-lived process per
  worker incarnation, starts the jobs at their time and kills them on timeout, on cancel
  and when the lease expires: a worker that is SIGKILLed, paused or cut off stops its
  jobs before the failure detector declares it dead;
- this main loop reads worker-inbox (assignments, claim replies, stop orders), claims
  through worker-reports, hands granted attempts to the executor, reports starts and outcomes,
  and streams logs.

Its concerns apart, each a module of its own: its configuration and its record of an
attempt (connectors/worker/config.py); the job boundary: a job's environment
(jobenv.py), its secrets (secrets.py), its user (runas.py), its sandbox (confine.py),
its run directory (rundirs.py) and its output cap (outputcap.py); what a run is reported
as (outcomes.py); what an earlier incarnation or a dead executor left (recovery.py).

Guarantees: an attempt starts only after the ledger granted the claim, and at most once,
also across restarts: the "started" journal line is fsynced (one fsync per batch) before
the executor is asked to start it. A report counts as made only when Kafka acknowledged
it; until then a restart sends it again. Reservations are in time
(streams/core/timeline.py): a run claimed ahead holds its resources from its start.

One clock: a run's start time (`not_before_ms`) is broker time, and the worker starts it
when the broker's time has reached it, not its own wall clock (a worker 8 s ahead would
start runs 8 s early; and the ledger, which dispatches again an attempt whose worker was
declared dead before its start time, would then get two executions). The worker's broker
clock (streams/core/clock.py) is a lower bound of the broker's time, fed by the delivery
reports of its heartbeats and of its reports (both topics have LogAppendTime);
each granted attempt is handed to the executor with the monotonic instant at which that
bound reaches its start time. Before its first sample the worker starts nothing (it has
no lease either). The records it stamps itself carry that clock's time too.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from connectors.worker.config import (
    CLAIM_REPLY_S,
    HEARTBEAT_PRODUCER,
    HORIZON_MS,
    INBOX_ASK_S,
    LOOP_STUCK_S,
    MAX_HELD,
    RECONNECT,
    START_WAIT_S,
    TAIL_EVERY_S,
    Attempt,
    Key,
    WorkerConfig,
)
from connectors.worker.executor import (
    Executor,
    Finished,
    NoopExecutor,
    ProcessExecutor,
    Started,
    StartSpec,
)
from connectors.worker.heartbeat import Heartbeat
from connectors.worker.housekeeping import Housekeeping
from connectors.worker.jobenv import JobEnvironment
from connectors.worker.journal import Entry, Journal
from connectors.worker.outcomes import error_of, exit_code_of
from connectors.worker.recovery import Recovery
from connectors.worker.report_hold import ReportHold
from connectors.worker.rundirs import attempt_dir
from connectors.worker.runlogs import LogTail
from connectors.worker.secrets import MissingSecret, Secrets
from schemas.codec import JOB_LOG, WORKER_INBOX, CodecError
from schemas.json import to_plain
from schemas.records import (
    CancelOrder,
    ClaimReply,
    ClaimRequested,
    DispatchRequest,
    RunFinished,
    RunReleased,
    RunStarted,
    WorkerAssignment,
)
from streams import metrics
from streams.core.clock import SYSTEM_CLOCK, BrokerClock, Clock, broker_stamp
from streams.core.ids import job_of
from streams.core.placement import Capacity, labels_match
from streams.core.timeline import DurationEstimates, Timeline, as_vector
from streams.inboxes import MISS_TTL_S, REFRESH_MIN_S, ensure_private_inbox, private_inbox
from streams.kafka import KAFKA_CLIENTS, Clients, committed_or, consumer_config, producer_config
from streams.settings import Settings
from streams.topics import TopicError

# WorkerConfig and HEARTBEAT_PRODUCER live in connectors/worker/config.py; named here too.
__all__ = ["HEARTBEAT_PRODUCER", "Worker", "WorkerConfig"]
log = logging.getLogger("cronlog.worker")
_STARTED = metrics.WORKER_REPORTS.labels("started")
_FINISHED = metrics.WORKER_REPORTS.labels("finished")
_RELEASED = metrics.WORKER_REPORTS.labels("released")


class Worker(Recovery):
    def __init__(
        self,
        settings: Settings,
        config: WorkerConfig,
        clock: Clock = SYSTEM_CLOCK,
        clients: Clients = KAFKA_CLIENTS,
    ):
        self.settings = settings
        self.clients = clients
        self.clock = clock
        self.config = config
        self.dir = config.state_dir / config.worker_id
        self.dir.mkdir(parents=True, exist_ok=True)
        if config.run_as is not None:
            # Jobs run as another user: what this worker writes from now on is its own
            # (0600/0700), and its folders only traversable, so a job reaches its own
            # run directory (which it owns) and nothing else here: not the journal (the
            # dispatches of other jobs), not the executor's logs, not the leases.
            os.umask(0o077)
            for folder in (self.dir, self.dir / "runs"):
                folder.mkdir(parents=True, exist_ok=True)
                folder.chmod(0o711)
            for left in self.dir.iterdir():  # an earlier incarnation's, made 0644
                if left.is_file():
                    left.chmod(0o600)
        self.journal = Journal(self.dir / "journal.jsonl")
        self.housekeeping = Housekeeping(
            self.dir,
            self.journal,
            config.keep_s,
            in_use=lambda: [a.run_dir for a in self.attempts.values() if a.run_dir],
            current_log=lambda: self.executor.log_path,
        )
        self.attempts: dict[Key, Attempt] = {}
        self.timeline = Timeline(config.capacity)
        self.durations = DurationEstimates()
        self.granted: list[Attempt] = []  # granted this pass, started together
        self.adopted: dict[Key, tuple[Attempt, Entry]] = {}  # an earlier incarnation's
        self.resend: list[Any] = []  # reports not delivered or not queued, oldest first
        # Attempts whose report of their end was sent and not yet acknowledged: still
        # listed in the beats, so that were this worker lost before Kafka took the
        # report, the dispatcher's verdict settles the attempt (not the timeout backstop).
        self.unacknowledged: set[Key] = set()
        # Start reports not sent yet, with when they were made (monotonic): each waits
        # `START_WAIT_S` for its run's end, to go in the same report.
        self.waiting_starts: dict[Key, tuple[float, RunStarted]] = {}
        # Reports of ended runs held while the executor starts a burst (report_hold.py).
        self.hold: ReportHold[Callable[[], None]] = ReportHold()
        self.view: tuple[Capacity, tuple[Key, ...]] = (config.capacity, ())
        self.stop_event = threading.Event()
        self.broker = BrokerClock()
        self.producer = self.clients.producer(producer_config(settings, **RECONNECT))
        self.topics = {
            n: settings.topic(n)
            for n in (
                "worker-reports",
                "heartbeats",
                "run-logs",
                "worker-handbacks",
            )
        }
        self.lease = self.dir / "lease.none"
        self.executor: Executor = NoopExecutor()
        self.checked_adopted = 0.0
        # Per earlier executor's log: what was read of it so far, and where to go on.
        self.adopted_logs: dict[str, tuple[dict[Key, dict[str, Any]], int]] = {}
        self.loop_seen = self.clock.monotonic()
        self.inbox_ready = False
        self._inbox = ""  # its own inbox topic, known once run() starts
        self.gauged = 0.0
        for resource, offered in zip(
            ("cpu", "memory_mb", "gpu"),
            (config.capacity.cpu, config.capacity.memory_mb, config.capacity.gpu),
            strict=True,
        ):
            metrics.WORKER_CAPACITY.labels(resource).set(offered)
        # What of the worker's own environment every job gets (taken once, not per run).
        # Not configuration: the process environment handed on to the jobs' processes.
        self.job_env = JobEnvironment(os.environ, config.run_as, Secrets(config.secrets_dir))
        self.tailed = 0.0
        self.published = 0.0
        self.consume_error_logged = 0.0

    # -- the executor ----------------------------------------------------------------------
    def _new_executor(self) -> Executor:
        if self.config.executor == "noop":
            return NoopExecutor(self.broker)
        incarnation = time.time_ns()
        self.lease = self.dir / f"lease.{incarnation}"
        cap = self.config.capacity
        return ProcessExecutor(
            self.lease,
            self.dir / f"executor.{incarnation}.log",
            (cap.cpu, float(cap.memory_mb), float(cap.gpu)),
            grace_s=self.config.fence_grace_s,
            max_gap_s=self.config.max_gap_s,
            stderr=self.dir / "executor.stderr",
            run_as=None if self.config.run_as is None else self.config.run_as.ids,
            confinement=self.config.confinement,
            broker=self.broker,
            output_cap_mb=self.config.output_cap_mb,
        )

    def _now_ms(self) -> int:
        """The broker's time (from below) once known; this machine's clock before."""
        now = self.broker.now_ms(self.clock.monotonic())
        return int(self.clock.time() * 1000) if now is None else now

    def _at(self, mono: float | None, wall_ms: int) -> int:
        """An executor's time of an event (monotonic, and wall ms) in broker time. A
        monotonic time ahead of this process's is an earlier boot's (an executor's log
        read after a reboot): its wall time stands in."""
        if mono is None or mono > self.clock.monotonic():
            return wall_ms
        at = self.broker.now_ms(mono)
        return wall_ms if at is None else at

    # -- main loop -------------------------------------------------------------------------
    def run(self) -> None:
        self._inbox = self._private_inbox()
        if self.stop_event.is_set():
            return
        self._recover()
        self.executor = self._new_executor()
        self.housekeeping.run(at_start=True)
        self._publish()

        def beat_producer() -> Any:
            return self.clients.producer(
                producer_config(self.settings, **HEARTBEAT_PRODUCER, **RECONNECT)
            )

        heartbeat = Heartbeat(
            beat_producer(),
            self.topics["heartbeats"],
            self.config.worker_id,
            self.config.capacity,
            self.config.labels,
            heartbeat_s=self.config.heartbeat_s,
            ack_window_s=self.config.ack_window_s,
            lease_s=self.config.lease_s,
            arm_ahead_s=max(self.config.arm_ahead_s, self.config.heartbeat_s + 0.5),
            view=lambda: self.view,
            lease_file=lambda: self.lease,
            stop=self.stop_event,
            loop_alive=lambda: self.clock.monotonic() - self.loop_seen < LOOP_STUCK_S,
            observe=self._observe,
            now_ms=self._now_ms,
            new_producer=beat_producer,
            broker_ms=lambda: self.broker.now_ms(self.clock.monotonic()),
        )
        threading.Thread(target=heartbeat.loop, name="heartbeat", daemon=True).start()
        consumer = self.clients.consumer(
            consumer_config(
                self.settings, self.settings.group(f"worker-{self.config.worker_id}"), **RECONNECT
            )
        )
        inbox = [TopicPartition(self._inbox, 0)]
        consumer.assign(committed_or(consumer, inbox, stop=self.stop_event))
        self.inbox_ready = True
        lag = metrics.ConsumerLag("worker", self.settings.topic_prefix)
        log.info("worker %s ready (inbox %s)", self.config.worker_id, self._inbox)
        try:
            while not self.stop_event.is_set():
                self.loop_seen = self.clock.monotonic()
                messages = consumer.consume(500, timeout=0.05)
                for msg in messages:
                    if (error := msg.error()) is not None:
                        self._consume_error(error)
                    elif msg.key() == self.config.worker_id.encode():
                        self.handle_inbox_record(msg.value() or b"")
                self._start_granted()
                self.journal.flush()  # this batch's lines to the OS: a kill -9 keeps them
                self._gauges()
                if messages:
                    # Replays after a crash are harmless (the journal and the attempt
                    # table ignore repeats); committing keeps them short.
                    consumer.commit(asynchronous=True)
                self.pump()
                self._publish()
                self.producer.poll(0)
                lag.report(consumer)
        finally:
            self.stop_event.set()
            consumer.close()
            self.executor.close()
            self._send_waiting_starts(math.inf)
            self._send_held()
            self._send_again()
            self.producer.flush(10)
            self.journal.flush()

    def stop(self) -> None:
        self.stop_event.set()

    def _private_inbox(self) -> str:
        """This worker's own inbox topic (streams/inboxes.py), made if it is missing; until
        the broker answers, asked again. Made now: wait until no node can still route
        this worker's messages to the shared inbox, which it does not read."""
        name = private_inbox(self.settings, self.config.worker_id)
        if name is None:
            raise PermissionError(f"worker id {self.config.worker_id!r} cannot name an inbox")
        while not self.stop_event.is_set():
            try:
                if ensure_private_inbox(
                    self.settings, self.config.worker_id, INBOX_ASK_S, self.clients
                ):
                    self.stop_event.wait(MISS_TTL_S + REFRESH_MIN_S)
                return name
            except KafkaException as exc:
                # Started while the broker is down: wait for it, as every other part does.
                log.warning(
                    "Kafka unreachable: cannot make sure of the inbox %s yet (%s); retrying",
                    name,
                    exc,
                )
                self.stop_event.wait(2.0)
            except TopicError as exc:
                # The cluster answers but cannot hold the topic yet (brokers missing).
                log.warning("cannot make the inbox %s yet (%s); retrying", name, exc)
                self.stop_event.wait(2.0)
        return name

    def _consume_error(self, error: KafkaError) -> None:
        """librdkafka reconnects by itself, for ever: say that the worker waits (what it
        cannot report meanwhile stays queued, and is sent again if it ever fails)."""
        if self.clock.monotonic() - self.consume_error_logged >= 10:
            self.consume_error_logged = self.clock.monotonic()
            log.warning("reading worker-inbox: %s; waiting for Kafka", error)

    def _publish(self) -> None:
        if self.clock.monotonic() - self.published < 0.2:
            return  # the heartbeat reads it every few seconds
        self.published = self.clock.monotonic()
        now = self._now_ms()  # run start times are broker time
        self.timeline.forget_before(now)
        # An attempt whose report is held is still listed: were this worker lost before
        # sending it, the dispatcher's verdict settles it (the ledger has only its claim).
        held = tuple(self.attempts) + self.hold.keys()
        if self.unacknowledged:
            held += tuple(k for k in self.unacknowledged if k not in self.attempts)
        self.view = (self.timeline.free(now, HORIZON_MS), held)

    # -- sending ---------------------------------------------------------------------------
    def send(self, record: Any, on_ack: Callable[[], None] | None = None) -> None:
        """Produce to worker-reports (relayed to job-log by ingress); `on_ack()` once Kafka
        acknowledged it. The acknowledgement carries the broker's append time: a sample
        for the broker clock."""

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                stamp = broker_stamp(msg.timestamp())
                if stamp is not None:
                    self._observe(stamp)
                if on_ack is not None:
                    on_ack()
            else:
                log.warning("report not delivered (%s); sending it again", err)
                self.resend.append((record, on_ack))

        if self.resend:
            self.resend.append((record, on_ack))  # after those already waiting, in order
            return
        try:
            self.producer.produce(
                self.topics["worker-reports"],
                key=record.job_id.encode(),
                value=JOB_LOG.encode(record),
                on_delivery=delivered,
            )
        except BufferError:
            # The producer's queue is full (a long broker outage, a burst of output):
            # the report waits here, and goes again at the next pass.
            self.resend.append((record, on_ack))

    def _observe(self, stamp: int) -> None:
        """A broker time from a delivery report (of a beat, on the heartbeat thread, or of
        a report): the broker clock's sample."""
        first = not self.broker.synced
        self.broker.observe(stamp, self.clock.monotonic())
        if first:
            skew_s = (
                self.clock.time() * 1000 - (self.broker.now_ms(self.clock.monotonic()) or 0)
            ) / 1000
            log.log(
                logging.WARNING if abs(skew_s) >= 1 else logging.INFO,
                "broker clock synced: this machine's clock is %.3f s %s the broker's; runs "
                "start by the broker's",
                abs(skew_s),
                "ahead of" if skew_s >= 0 else "behind",
            )

    # -- the inbox -------------------------------------------------------------------------
    def handle_inbox_record(self, raw: bytes) -> None:
        """Act on one record of this worker's inbox (an assignment, a claim's reply, a
        kill...); the inbox loop calls it for each record, and
        tests/integration/test_worker_faults.py feeds it records directly."""
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
            self._stop_order(message)

    def _assigned(self, d: DispatchRequest) -> None:
        key = (d.run_id, d.attempt)
        if key in self.attempts or self.journal.phase(*key) in ("started", "reported"):
            return  # a repeated assignment: claimed or ran already
        expected = self.durations.expected_ms(d.job_id)
        if (
            not labels_match(d.resources.labels, self.config.labels)
            or len(self.attempts) + len(self.hold) >= MAX_HELD
            or not self.timeline.fits(d.resources, d.not_before_ms, expected)
        ):
            # Release it at once rather than leave it to the claim deadline (30 s
            # after its time): the dispatcher that placed it places it again, and that
            # placement is still booked on this worker in its view, so it goes
            # elsewhere. This release names the run only (worker-handbacks): a worker's
            # credentials never write dispatch requests (any command, for any worker).
            log.info(
                "no room for %s#%d; releasing it for placement",
                *key,
                extra={"run_id": d.run_id, "job_id": d.job_id, "attempt": d.attempt},
            )
            back = RunReleased(
                d.job_id,
                d.run_id,
                d.attempt,
                self.config.worker_id,
                "no room",
                self._now_ms(),
                d.placement,
            )
            self.producer.produce(
                self.topics["worker-handbacks"], key=d.run_id.encode(), value=JOB_LOG.encode(back)
            )
            return
        self.timeline.plan(key, d.resources, d.not_before_ms, expected)
        attempt = Attempt(d, "claiming", since=self.clock.monotonic())
        attempt.claimed_mono = time.monotonic()  # the lease's clock (engine.py `Lease`)
        self.attempts[key] = attempt
        self.journal.record(d.run_id, d.attempt, d.job_id, "claiming", dispatch=to_plain(d))
        attempt.claimed_ms = self._claim(d)

    def _claim(self, d: DispatchRequest) -> int:
        at = self._now_ms()
        self.send(
            ClaimRequested(d.job_id, d.run_id, d.attempt, self.config.worker_id, at, d.placement)
        )
        return at

    def _replied(self, reply: ClaimReply) -> None:
        key = (reply.run_id, reply.attempt)
        attempt = self.attempts.get(key)
        if attempt is None or attempt.phase != "claiming":
            if reply.granted and attempt is None:
                self._unwanted_grant(reply)
            return
        if reply.at_ms != attempt.claimed_ms:
            # The reply to an earlier claim of this attempt (replayed from the inbox after
            # a restart, or before the attempt was released and assigned again): the
            # ledger answers each claim with that claim's own stamp.
            return
        if not reply.granted:
            self._drop(attempt)
            return
        attempt.phase = "granted"
        self.granted.append(attempt)

    def _unwanted_grant(self, reply: ClaimReply) -> None:
        """A grant for an attempt this worker does not hold: release it at once rather
        than leave the run dispatched to nobody until its timeout. Either the claim was
        given up before the reply came ("dropped"), or an earlier incarnation claimed it
        and was killed before its "claiming" line reached the disk: the journal does not
        know it, and the reply, not yet committed in the inbox, is read again. (A
        "started" line is fsynced before any start, so an attempt unknown here never
        started on this worker.) The ledger refuses a release of an attempt that is not
        dispatched to this worker, so a late reply to an attempt long over changes
        nothing."""
        key = (reply.run_id, reply.attempt)
        phase = self.journal.phase(*key)
        if phase == "dropped":
            why = "the claim was given up before its reply came"
        elif phase is None:
            why = "claimed by an earlier incarnation of this worker that forgot it"
        else:
            return
        job_id = self.journal.entries[key].job_id if phase else job_of(reply.run_id)
        at = self._now_ms()
        self.send(
            RunReleased(
                job_id, reply.run_id, reply.attempt, self.config.worker_id, why, at, reply.placement
            )
        )

    def _drop(self, attempt: Attempt) -> None:
        d = attempt.dispatch
        self.attempts.pop(attempt.key, None)
        self.timeline.end(attempt.key)
        self.journal.record(d.run_id, d.attempt, d.job_id, "dropped")

    def _stop_order(self, order: CancelOrder) -> None:
        attempt = self.attempts.get((order.run_id, order.attempt))
        if attempt is None:
            return
        attempt.cancelled, attempt.stop_reason = True, order.reason
        if attempt.phase == "claiming":
            self._drop(attempt)
        elif attempt.phase == "started" and attempt.executor is not None:
            attempt.executor.cancel(attempt.key)
        elif attempt.phase == "granted":
            # Granted, not yet handed to the executor: released, which is the answer the
            # ledger waits for before it records the cancel.
            self.granted = [a for a in self.granted if a is not attempt]
            self._release(attempt, "cancelled before the start")

    # -- execution -------------------------------------------------------------------------
    def _start_granted(self) -> None:
        """Journal a batch of grants with one fsync, then hand them to the executor, each
        with the monotonic instant at which the broker's time reaches its start."""
        if not self.granted or not self.broker.synced:
            return  # no broker time yet: wait for it (a grant follows a claim's report)
        batch, self.granted = self.granted, []
        executor = self.executor
        envs: dict[Key, dict[str, str]] = {}
        for attempt in list(batch):
            try:
                envs[attempt.key] = self.job_env.of(attempt.dispatch)
            except MissingSecret as exc:
                # Never started: a failure of this attempt, with the secret's name only.
                log.warning("run %s not started: %s", attempt.dispatch.run_id, exc)
                batch.remove(attempt)
                self._report(attempt, None, str(exc), self._now_ms())
        for attempt in batch:
            d = attempt.dispatch
            attempt.run_dir = attempt_dir(self.dir / "runs", d.run_id, d.attempt)
            self.journal.record(
                d.run_id,
                d.attempt,
                d.job_id,
                "started",  # the dispatch is in the "claiming" line, written before
                run_dir=str(attempt.run_dir),
                executor_log=executor.log_path,
                executor_pid=executor.pid,
            )
        self.journal.sync()  # durable before any of them can start
        for attempt in batch:
            d = attempt.dispatch
            attempt.phase, attempt.executor = "started", executor
            self.hold.handed(attempt.key, d.not_before_ms)
            assert attempt.run_dir is not None
            executor.start(
                StartSpec(
                    attempt.key,
                    attempt.run_dir,
                    d.command,
                    envs[attempt.key],
                    d.timeout_s,
                    d.resources.memory_mb,
                    d.not_before_ms,
                    as_vector(d.resources),
                    self.broker.mono_at(d.not_before_ms),
                    claimed_mono=attempt.claimed_mono,
                )
            )

    def _gauges(self) -> None:
        now = self.clock.monotonic()
        if now - self.gauged < 1.0:
            return
        self.gauged = now
        phases: dict[str, int] = dict.fromkeys(("claiming", "granted", "started"), 0)
        for attempt in self.attempts.values():
            phases[attempt.phase] = phases.get(attempt.phase, 0) + 1
        for phase, count in phases.items():
            metrics.WORKER_ATTEMPTS.labels(phase).set(count)
        for resource, used in zip(("cpu", "memory_mb", "gpu"), self.timeline.running, strict=True):
            metrics.WORKER_USED.labels(resource).set(used)

    def ready(self) -> str | None:
        """None once its inbox is assigned, else why not (the metrics port's /readyz)."""
        return None if self.inbox_ready else "worker: inbox not assigned yet"

    def alive(self) -> bool:
        return self.clock.monotonic() - self.loop_seen < LOOP_STUCK_S

    def pump(self) -> None:
        """Executor events, its health, the logs of long runs, failed deliveries."""
        for event in self.executor.events():
            attempt = self.attempts.get(event.key)
            if attempt is None:
                continue
            if isinstance(event, Started):
                self._started(attempt, event)
            else:
                self._finished(attempt, event)
        problem = self.executor.health()
        if problem:
            self._replace_executor(problem)
        now = self.clock.monotonic()
        if now - self.tailed >= TAIL_EVERY_S:  # the output of long runs, as it comes
            self.tailed = now
            for attempt in self.attempts.values():
                if attempt.tail is not None:
                    attempt.tail.send_new(
                        self.producer, self.topics["run-logs"], self.config.worker_id
                    )
        self.housekeeping.maybe()
        if now - self.checked_adopted >= 0.5:
            self.checked_adopted = now
            self._check_adopted()
            for attempt in [a for a in self.attempts.values() if a.phase == "claiming"]:
                if now - attempt.since > CLAIM_REPLY_S:
                    # No answer. Should the claim have been granted after all, the
                    # release puts the run back to due (the ledger rejects it otherwise).
                    self._drop(attempt)
                    self._release(attempt, "no reply to the claim")
        self._send_waiting_starts(now - START_WAIT_S)
        if self.hold and (self.hold.expired(now) or not self._starts_behind()):
            self._send_held()
        self._send_again()

    def _send_again(self) -> None:
        """The reports not delivered, or not queued (a full queue), in the order made."""
        resend, self.resend = self.resend, []
        for record, on_ack in resend:
            self.send(record, on_ack)

    def _starts_behind(self) -> bool:
        """Whether the executor is starting a burst: a run handed to it has reached its
        start time and has not started."""

        def waiting(key: Key) -> bool:
            attempt = self.attempts.get(key)
            return attempt is not None and attempt.phase == "started" and attempt.started_ms is None

        return self.hold.behind(self._now_ms(), waiting)

    def _send_report(self, key: Key, send: Callable[[], None], ran: bool) -> None:
        """Send an ended run's report (`send`: its last output, then its end), or hold it
        while the executor starts a burst (report_hold.py); they go in the order made.
        Only the report of an attempt the executor had (`ran`) waits: one that never got
        there (a missing secret) goes at once, its journal line still `claiming`."""
        if ran and self._starts_behind():
            self.hold.hold(key, send, self.clock.monotonic())
            return
        self._send_held()
        send()

    def _send_held(self) -> None:
        for send in self.hold.take():
            send()

    def _send_waiting_start(self, key: Key) -> None:
        """Send the start report of `key` if it waits: it started, which is reported
        whatever became of it, and before any later report of it."""
        waiting = self.waiting_starts.pop(key, None)
        if waiting is not None:
            self.send(waiting[1])

    def _send_waiting_starts(self, made_by: float) -> None:
        """Send the waiting start reports made by `made_by` (monotonic): their runs go on."""
        while self.waiting_starts:
            key, (made, record) = next(iter(self.waiting_starts.items()))
            if made > made_by:
                return  # they wait in the order they were made
            del self.waiting_starts[key]
            self.send(record)

    def _started(self, attempt: Attempt, event: Started) -> None:
        d = attempt.dispatch
        at = self._at(event.started_mono, event.started_ms)
        attempt.pid, attempt.started_ms = event.pid, at
        if d.attempt == 1:  # the lateness of a firing: its first attempt's start
            metrics.RUN_START_LATENESS.labels(d.owner).observe((at - d.scheduled_ms) / 1000)
        _STARTED.inc()
        self.timeline.begin(attempt.key, d.resources)
        if attempt.run_dir is not None and self.executor.output:
            attempt.tail = LogTail(d.run_id, d.attempt, attempt.run_dir)
        # Waits for its end (`START_WAIT_S`): a short run is reported once, start and end.
        self.waiting_starts[attempt.key] = (
            self.clock.monotonic(),
            RunStarted(d.job_id, d.run_id, d.attempt, self.config.worker_id, at, d.placement),
        )

    def _finished(self, attempt: Attempt, event: Finished) -> None:
        d = attempt.dispatch
        unreported: int | None = None  # a start not reported yet, known from the end
        if event.outcome == "not_started":
            self._release(attempt, event.error)
            return
        if event.started_ms is not None:
            took_ms = event.finished_ms - event.started_ms
            if event.started_mono is not None and event.finished_mono is not None:
                took_ms = int((event.finished_mono - event.started_mono) * 1000)
            self.durations.observe(d.job_id, took_ms)
            if attempt.started_ms is None:  # the Started event was not seen (adopted)
                # Reported with its end, like a start whose report is still waiting.
                unreported = attempt.started_ms = self._at(event.started_mono, event.started_ms)
        if (
            attempt.tail is None
            and attempt.run_dir is not None
            and event.started_ms is not None
            and self.executor.output
        ):
            attempt.tail = LogTail(d.run_id, d.attempt, attempt.run_dir)
        at = self._at(event.finished_mono, event.finished_ms)
        error = error_of(event)
        if event.outcome == "cancelled" and attempt.stop_reason:
            # Which order stopped it (a cancel, the timeout backstop's question): a
            # run the backstop stopped is not one a user cancelled.
            error = f"stopped: {attempt.stop_reason}"
        self._report(attempt, exit_code_of(event), error, at, unreported)

    def _report(
        self,
        attempt: Attempt,
        code: int | None,
        error: str,
        at_ms: int,
        started_ms: int | None = None,
    ) -> None:
        """Report an attempt's end, with its start if that was not reported: its report
        is still waiting, or `started_ms` gives it."""
        d = attempt.dispatch
        waiting = self.waiting_starts.pop(attempt.key, None)
        record = RunFinished(
            d.job_id,
            d.run_id,
            d.attempt,
            self.config.worker_id,
            code,
            error,
            at_ms,
            d.placement,
            started_ms=started_ms if waiting is None else waiting[1].at_ms,
        )
        tail = attempt.tail

        def send() -> None:
            if tail is not None:  # the rest of its output goes before its end
                tail.send_new(self.producer, self.topics["run-logs"], self.config.worker_id)
            self.unacknowledged.add(attempt.key)
            self.send(record, lambda: self._reported(d))

        self._send_report(attempt.key, send, ran=attempt.phase == "started")
        _FINISHED.inc()
        self._forget(attempt)

    def _release(self, attempt: Attempt, why: str) -> None:
        """Release an attempt that never started: the ledger dispatches it again."""
        d = attempt.dispatch
        at = self._now_ms()
        record = RunReleased(
            d.job_id, d.run_id, d.attempt, self.config.worker_id, why, at, d.placement
        )
        self._send_waiting_start(attempt.key)  # first, should one wait (none does today)
        if attempt.run_dir is not None:
            # Made ahead of a start that never came (engine.py `_prepare_ahead`): gone
            # before the attempt may come back here, whose directory is made fresh. The
            # attempt's only: the run's may be in use by another attempt being made.
            shutil.rmtree(attempt.run_dir, ignore_errors=True)
            if attempt.run_dir.exists():
                log.warning("the directory of %s could not be removed", attempt.run_dir)
        # "released", not "reported": the same attempt may be assigned here again. Not
        # listed while unacknowledged: a listing would read, to a dispatcher placing the
        # attempt here again, as the new placement claimed.
        self.send(record, lambda: self._reported(d, "released"))
        _RELEASED.inc()
        self._forget(attempt)

    def _reported(self, d: DispatchRequest, phase: str = "reported") -> None:
        if phase == "reported":
            self.unacknowledged.discard((d.run_id, d.attempt))
        self.journal.record(d.run_id, d.attempt, d.job_id, phase)

    def _forget(self, attempt: Attempt) -> None:
        self._send_waiting_start(attempt.key)
        attempt.phase = "done"
        self.attempts.pop(attempt.key, None)
        self.adopted.pop(attempt.key, None)
        self.timeline.end(attempt.key)
