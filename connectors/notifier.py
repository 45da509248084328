"""`cronlog notifier`: webhooks for runs that failed, were lost, skipped or started late.

Its own consumer group on run-events (several notifiers share the partitions; one is
enough). What to send is decided by streams/core/notifications.py; this module reads,
calls and commits:

- Which jobs to watch: on each assignment the notifier reads the compacted `jobs` topic's
  partition (co-partitioned with run-events: same key, same count) for the specs with a
  `notify` or an `sla_s`, or whose owner has a route in the notifier's configuration
  (`--routes FILE`, ``owners: {team-a: {url: ..., on: [failed, lost]}}``); the job
  events in run-events keep that up to date.
- Delivery: a POST with a JSON body and the headers ``X-Cronlog-Delivery`` (the stable
  delivery id) and ``X-Cronlog-Event`` (the kind), from a pool of threads, to public
  addresses only unless the operator allows more (connectors/webhooks.py). A 2xx answer
  delivers; 5xx, 408, 429 and no answer are retried with doubling backoff up to
  `max_attempts`; another 4xx, or a destination refused, is not retried. A notification
  not delivered goes to the `notifications.dlq` topic with its body, URL and last error.
- At least once: a partition's committed offset never passes an event whose
  notifications are not settled (delivered or dead-lettered) or whose run is still
  watched for lateness; a notifier killed at any point reads those events again and
  sends their notifications again, with the same delivery ids.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import httpx
import orjson
import yaml
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from connectors import safe_yaml
from connectors.webhooks import DestinationRefused, Destinations, guarded_client
from schemas.codec import JOB_STATE, RUN_EVENTS, CodecError
from schemas.records import JobEvent, RunEvent
from schemas.spec import Notify
from streams import metrics
from streams.core.clock import SYSTEM_CLOCK, Clock
from streams.core.command_spec import parse_notify
from streams.core.notifications import (
    Alert,
    Lateness,
    Route,
    Watch,
    backoff_s,
    final_alert,
    late_routes,
    watch_after,
    watch_for,
)
from streams.kafka import KAFKA_CLIENTS, Clients, consumer_config, producer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.notifier")
COMMIT_EVERY_S = 1.0
Token = tuple[int, int, int]  # (assignment generation, partition, offset)


class RoutesError(ValueError):
    pass


def load_routes(path: str | Path | None) -> dict[str, Notify]:
    """The per-owner routes of a YAML/JSON file ``owners: {owner: {url, on}}``, validated
    by the same rules as a job's `notify` (`late` applies to the owner's jobs that have an
    sla_s)."""
    if path is None:
        return {}
    try:
        doc = safe_yaml.load_file(path) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise RoutesError(f"cannot read {path}: {exc}") from exc
    owners = doc.get("owners") if isinstance(doc, dict) else None
    if not isinstance(owners, dict):
        raise RoutesError(f"{path}: expected a mapping `owners: {{owner: {{url, on}}}}`")
    routes: dict[str, Notify] = {}
    for owner, value in owners.items():
        try:
            routes[str(owner)] = parse_notify(value)
        except ValueError as exc:
            raise RoutesError(f"{path}: owners.{owner}: {exc}") from exc
    return routes


def alert_body(alert: Alert) -> bytes:
    def iso(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")

    return orjson.dumps(
        {
            "delivery_id": alert.delivery_id,
            "kind": alert.kind,
            "job_id": alert.job_id,
            "owner": alert.owner,
            "run_id": alert.run_id,
            "scheduled_at": iso(alert.scheduled_ms),
            "attempt": alert.attempt,
            "state": alert.state,
            "reason": alert.reason,
            "exit_code": alert.exit_code,
            "at": iso(alert.at_ms),
        }
    )


@dataclass(frozen=True, slots=True)
class DeliveryPolicy:
    max_attempts: int = 6
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    timeout_s: float = 10.0


class Notifier:
    def __init__(
        self,
        settings: Settings,
        owner_routes: dict[str, Notify] | None = None,
        policy: DeliveryPolicy | None = None,
        workers: int = 8,
        clock: Clock = SYSTEM_CLOCK,
        clients: Clients = KAFKA_CLIENTS,
        destinations: Destinations | None = None,
    ):
        self.settings = settings
        self.clients = clients
        self.owner_routes = owner_routes or {}
        self.policy = policy or DeliveryPolicy()
        self.clock = clock
        self.events_topic = settings.topic("run-events")
        self.jobs_topic = settings.topic("jobs")
        self.dlq_topic = settings.topic("notifications.dlq")
        self.consumer = self.clients.consumer(
            consumer_config(
                settings, settings.group("notifier"), **{"reconnect.backoff.max.ms": 1000}
            )
        )
        self.producer = self.clients.producer(
            producer_config(settings, **{"enable.idempotence": True})
        )
        self.http = guarded_client(destinations or Destinations(), self.policy.timeout_s)
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="notify")
        self._stop = threading.Event()
        self.watches: dict[str, Watch] = {}
        self.lateness: Lateness[Token] = Lateness()
        # Per owned partition: offsets with unsettled work (a count each), the next offset
        # to read, and the generation of its assignment (settlements of an older one are
        # ignored: the partition moved away and back, its events are read again).
        self.pending: dict[int, Counter[int]] = {}
        self.next_offset: dict[int, int] = {}
        self.generation: dict[int, int] = {}
        self.settled: queue.SimpleQueue[Token] = queue.SimpleQueue()
        self.assigned = False
        self.caught_up = False
        self._committed_at = 0.0

    def stop(self) -> None:
        self._stop.set()

    def ready(self) -> str | None:
        if not self.assigned:
            return "notifier: no partitions assigned yet"
        return None if self.caught_up else "notifier: catching up"

    # -- assignment -------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            p = tp.partition
            self.generation[p] = self.generation.get(p, 0) + 1
            self.pending[p] = Counter()
            self.next_offset.pop(p, None)
        self._load_watches([tp.partition for tp in partitions])
        consumer.incremental_assign(partitions)
        self.assigned = True
        self.caught_up = False

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._commit(force=True)
        gone = {tp.partition for tp in partitions}
        for p in gone:
            self.pending.pop(p, None)
            self.next_offset.pop(p, None)
            self.generation[p] = self.generation.get(p, 0) + 1
        self.lateness.forget(lambda token: token[1] in gone)

    def _load_watches(self, partitions: list[int]) -> None:
        """The watched jobs of these partitions, from the compacted `jobs` topic."""
        if not partitions:
            return
        reader = self.clients.consumer(
            consumer_config(self.settings, None, **{"enable.partition.eof": True})
        )
        try:
            reader.assign([TopicPartition(self.jobs_topic, p, -2) for p in partitions])
            left, seen = set(partitions), 0
            while left and not self._stop.is_set():
                msg = reader.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        left.discard(msg.partition() or 0)
                    continue
                seen += 1
                self._watch_state(msg.key(), msg.value())
            log.info("watching %d jobs (read %d job states)", len(self.watches), seen)
        finally:
            reader.close()

    def _watch_state(self, key: bytes | None, value: bytes | None) -> None:
        job_id = (key or b"").decode("utf-8", "replace")
        if value is None:
            self.watches.pop(job_id, None)
            return
        try:
            state = JOB_STATE.decode(value)
        except CodecError as exc:
            log.warning("undecodable job state of %s skipped: %s", job_id, exc)
            return
        self._watch(
            state.spec.job_id, None if state.deleted else watch_for(state.spec, self.owner_routes)
        )

    def _watch(self, job_id: str, watch: Watch | None) -> None:
        if watch is None:
            self.watches.pop(job_id, None)
        else:
            self.watches[job_id] = watch

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> None:
        self.consumer.subscribe(
            [self.events_topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        lag = metrics.ConsumerLag("notifier", self.settings.topic_prefix)
        try:
            while not self._stop.is_set():
                messages = self.consumer.consume(500, timeout=0.2)
                read = False
                for msg in messages:
                    if msg.error() is None:
                        read = True
                        self._event(msg)
                if not read and self.assigned:
                    self.caught_up = True
                self._tick()
                self._commit()
                lag.report(self.consumer)
        finally:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self._commit(force=True)
            self.consumer.close()
            self.producer.flush(5)
            self.http.close()

    def _event(self, msg: Message) -> None:
        p, offset = msg.partition() or 0, msg.offset() or 0
        if p not in self.pending:
            return  # revoked meanwhile
        self.next_offset[p] = offset + 1
        try:
            event = RUN_EVENTS.decode(msg.value() or b"")
        except CodecError as exc:
            log.warning("undecodable run event at %d/%d skipped: %s", p, offset, exc)
            return
        if isinstance(event, JobEvent):
            current = self.watches.get(event.job_id)
            self._watch(event.job_id, watch_after(event, current, self.owner_routes))
            return
        self._run_event(event, (self.generation[p], p, offset))

    def _run_event(self, event: RunEvent, token: Token) -> None:
        watch = self.watches.get(event.job_id)
        if watch is None:
            return
        found = final_alert(event, watch)
        if found is not None:
            alert, routes = found
            self._send(alert, routes, token)
        if watch.sla_ms is not None and late_routes(watch):
            seen = self.lateness.observe(event, watch, token)
            if seen.held:
                self._hold(token)
            if seen.freed is not None:
                self.settled.put(seen.freed)
            if seen.alert is not None:
                self._send(seen.alert, late_routes(watch), token)
        metrics.NOTIFIER_WATCHED.set(len(self.lateness))

    def _tick(self) -> None:
        for alert, token in self.lateness.due(int(self.clock.time() * 1000)):
            watch = self.watches.get(alert.job_id)
            if watch is not None:
                self._send(alert, late_routes(watch), token)
            self.settled.put(token)
        metrics.NOTIFIER_WATCHED.set(len(self.lateness))

    def _hold(self, token: Token) -> None:
        generation, p, offset = token
        if self.generation.get(p) == generation and p in self.pending:
            self.pending[p][offset] += 1

    def _send(self, alert: Alert, routes: tuple[Route, ...], token: Token) -> None:
        for route in routes:
            self._hold(token)
            self.pool.submit(self._deliver, alert, route, token)

    # -- delivery (pool threads) ------------------------------------------------------------
    def _deliver(self, alert: Alert, route: Route, token: Token) -> None:
        body = alert_body(alert)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "cronlog-notifier",
            "X-Cronlog-Delivery": alert.delivery_id,
            "X-Cronlog-Event": alert.kind,
        }
        error = ""
        for attempt in range(1, self.policy.max_attempts + 1):
            retry = True
            try:
                answer = self.http.post(route.url, content=body, headers=headers)
                if 200 <= answer.status_code < 300:
                    metrics.NOTIFICATION_ATTEMPTS.labels("ok").inc()
                    metrics.NOTIFICATIONS.labels(alert.kind, "delivered").inc()
                    self.settled.put(token)
                    return
                error = f"HTTP {answer.status_code}"
                retry = answer.status_code >= 500 or answer.status_code in (408, 429)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__}: {exc}"
            except DestinationRefused as exc:
                error, retry = f"refused: {exc}", False
            metrics.NOTIFICATION_ATTEMPTS.labels("retry" if retry else "refused").inc()
            if not retry or attempt == self.policy.max_attempts:
                break
            wait = backoff_s(attempt, self.policy.backoff_s, self.policy.max_backoff_s)
            if self._stop.wait(wait):
                return  # stopping: not settled, so sent again by the next notifier
        self._dead_letter(alert, route, attempt, error, body, token)

    def _dead_letter(
        self, alert: Alert, route: Route, attempts: int, error: str, body: bytes, token: Token
    ) -> None:
        record = orjson.dumps(
            {
                "delivery_id": alert.delivery_id,
                "url": route.url,
                "kind": alert.kind,
                "attempts": attempts,
                "error": error,
                "body": orjson.loads(body),
            }
        )
        try:
            self.producer.produce(self.dlq_topic, key=alert.job_id.encode(), value=record)
            if self.producer.flush(10) != 0:
                raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT))
        except (KafkaException, BufferError) as exc:
            # Not settled: the event's offset is not committed, and a restart sends again.
            log.error("could not dead-letter notification %s: %s", alert.delivery_id, exc)
            return
        log.warning(
            "notification %s to %s dead-lettered after %d attempts: %s",
            alert.delivery_id, route.url, attempts, error,
        )  # fmt: skip
        metrics.NOTIFICATIONS.labels(alert.kind, "dead_lettered").inc()
        metrics.NOTIFIER_DLQ.labels("notifier").inc()
        self.settled.put(token)

    # -- commits ----------------------------------------------------------------------------
    def _commit(self, force: bool = False) -> None:
        while True:
            try:
                generation, p, offset = self.settled.get_nowait()
            except queue.Empty:
                break
            counts = self.pending.get(p)
            if counts is not None and self.generation.get(p) == generation and counts[offset]:
                counts[offset] -= 1
                if not counts[offset]:
                    del counts[offset]
        now = self.clock.monotonic()
        if not force and now - self._committed_at < COMMIT_EVERY_S:
            return
        self._committed_at = now
        offsets = [
            TopicPartition(self.events_topic, p, min(self.pending[p], default=next_offset))
            for p, next_offset in self.next_offset.items()
            if p in self.pending
        ]
        if not offsets:
            return
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            log.warning("could not commit notifier offsets (%s); they are read again", exc)
