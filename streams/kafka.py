"""Kafka client configuration shared by every cronlog process.

One partitioner everywhere: `murmur2_random` is the Java client's (and aiokafka's)
partitioner. librdkafka's default (CRC32) would put a job's records on another partition
than other Kafka clients (a user's Java producer of commands) do, and the ledger relies
on every record of a job, and its state, living in the same partition number of each
topic.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient

from streams.core.timing import TIMING
from streams.logs import kafka_log_settings
from streams.settings import Settings

log = logging.getLogger("cronlog.kafka")
T = TypeVar("T")

PARTITIONER = "murmur2_random"


def partition_for(key: str, partitions: int) -> int:
    """The partition every cronlog producer puts `key` in (PARTITIONER: murmur2 of the
    key's bytes, as the Java client and aiokafka do), for readers that must know it (a
    worker's inbox partition, the API's inboxes)."""
    from aiokafka.partitioner import murmur2

    return int(murmur2(key.encode()) & 0x7FFFFFFF) % partitions


# Short: a dead ledger's open transaction blocks every read_committed reader of the
# partitions it wrote (the new owner's restore, dispatchers, workers' inboxes) until the
# broker aborts it after this long. About the session timeout, so the abort overlaps the
# rebalance. The ledger bounds the work of one transaction well below it (its budget,
# streams/ledger.py); a transaction that still takes longer is aborted and redone.
TRANSACTION_TIMEOUT_MS = int(TIMING.transaction_timeout_s * 1000)


def connection_config(settings: Settings) -> dict[str, Any]:
    """Where the brokers are and how to reach them (the CRONLOG_KAFKA_CONFIG properties:
    TLS, SASL): the base of every client cronlog builds on the cluster it schedules
    on. The loops get their clients through `Clients`; some edges (the topics tool, the
    API, the audit, the rebuild, the events reader) build theirs directly, from these
    functions too; the local stack's bootstrap admin client is the one built from its
    own settings (docs/architecture.md's module table)."""
    return {
        "bootstrap.servers": settings.kafka,
        # A request a broker does not answer (paused, hung: its connection stays open)
        # times out after this long, and librdkafka then drops the connection and asks
        # for the metadata again, finding the partitions' new leaders; its default, 60 s,
        # held every client on a broker paused for 20 s (the timing budget).
        "socket.timeout.ms": int(TIMING.request_timeout_s * 1000),
        # Leaders that moved are learnt within this, not when a request to the old one
        # times out: a client that has nothing in flight to a paused broker sends its next
        # request to the new leader (librdkafka's default, 5 min, chained each hop of a
        # run's way through its own request timeout). One metadata request per client
        # per second, for the topics it uses.
        "topic.metadata.refresh.interval.ms": int(TIMING.metadata_refresh_s * 1000),
        **dict(settings.kafka_config),
    }


def admin_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    return {**connection_config(settings), **kafka_log_settings(), **extra}


def producer_config(settings: Settings, **extra: Any) -> dict[str, Any]:
    return {
        **connection_config(settings),
        "partitioner": PARTITIONER,
        # Idempotence implies acks=all; said explicitly because a replicated cluster's
        # guarantee rests on it: a record is acknowledged only once every in-sync replica
        # (at least min.insync.replicas of them) has it.
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": "lz4",
        "request.timeout.ms": int(TIMING.request_timeout_s * 1000),
        **kafka_log_settings(),
        **extra,
    }


# The ledger's records become visible only at its commit, whose flush sends whatever is
# still queued at once (librdkafka ignores linger.ms while flushing): lingering the length
# of a transaction sends each partition's records in a request or two at the commit,
# instead of a request every 5 ms while the transaction decides (the broker's CPU is per
# request).
TRANSACTION_LINGER_MS = 1000


def transactional_producer_config(settings: Settings, transactional_id: str) -> dict[str, Any]:
    return producer_config(
        settings,
        **{
            "transactional.id": transactional_id,
            "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
            "linger.ms": TRANSACTION_LINGER_MS,
        },
    )


def consumer_config(settings: Settings, group: str | None, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        **connection_config(settings),
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        # The KIP-848 group protocol: the broker keeps a member, its assignment and its
        # session across a coordinator's failover (the classic protocol ended the session
        # on the client's side when the coordinator stopped answering, and every loop
        # gave up its partitions and restored them). Sessions and heartbeats are group
        # settings on the broker (`group_settings`). Range assignment gives one member
        # partition p of every topic it subscribes to (all cronlog topics have the same
        # count): the co-partitioning the scheduler needs.
        "group.protocol": "consumer",
        "group.remote.assignor": "range",
        # librdkafka prefetches up to 64 MB per consumer by default, and memory once taken
        # for a catch-up's prefetch stays with the process; 16 MB (some 100,000 state
        # records) still keeps every fetch busy.
        "queued.max.messages.kbytes": 16_384,
        # Once that queue is full librdkafka waits fetch.queue.backoff.ms (1 s by default)
        # before it fetches that partition again, though the loop empties the queue in
        # milliseconds: a catch-up of 200,000 state records spent 1.3 s of its 1.8 s in
        # that wait (0.5 s with 10 ms).
        "fetch.queue.backoff.ms": 10,
        **kafka_log_settings(),
        **extra,
    }
    if group is not None:
        config["group.id"] = group
    else:
        config["group.id"] = "cronlog-unused"  # librdkafka needs one even for assign()
    return config


class Clients:
    """Where a loop gets its Kafka clients, each from a config built above: passed to
    every loop (`clients=`), so what it talks to is chosen by whoever starts it. The
    default builds confluent-kafka's clients."""

    __slots__ = ()

    def consumer(self, config: dict[str, Any]) -> Consumer:
        return Consumer(config)

    def producer(self, config: dict[str, Any]) -> Producer:
        return Producer(config)

    def admin(self, config: dict[str, Any]) -> AdminClient:
        return AdminClient(config)

    def offsets_reader(self, config: dict[str, Any]) -> OffsetsReader:
        """A reader of the committed offsets of `config`'s group (`OffsetsReader`)."""
        return OffsetsReader(self.consumer(config))


class OffsetsReader:
    """Another group's committed offsets, asked without blocking the caller: a consumer
    of that group.id that never joins it (no subscribe) asks on a thread of its own, and
    the answer is a future. Not the admin client's ListConsumerGroupOffsets: asked every
    second through broker failovers it crashed the node process in librdkafka
    (`rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`, 2.16.2)."""

    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="offsets")

    def committed(self, partitions: list[TopicPartition]) -> Future[list[TopicPartition]]:
        return self.pool.submit(self.consumer.committed, partitions, OFFSETS_ASK_S)

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)  # an ask ends within its timeout
        self.consumer.close()


OFFSETS_ASK_S = 5.0  # an ask of committed offsets gives up after this


KAFKA_CLIENTS = Clients()


def committed_or(
    consumer: Consumer,
    partitions: list[TopicPartition],
    default: int = OFFSET_BEGINNING,
    stop: threading.Event | None = None,
) -> list[TopicPartition]:
    """`partitions` at the consumer group's committed offsets (`default` where none is),
    asked for explicitly and retried until the group coordinator answers.

    Why not `assign()` without offsets and let librdkafka look them up: if that lookup
    gets a request-level NOT_COORDINATOR (the group coordinator still moving or loading,
    as on a freshly started broker) librdkafka never retries it and never starts fetching
    the partition, silently (confluentinc/librdkafka#5586). A worker whose inbox stalls
    that way heartbeats forever and never runs anything.
    """
    while stop is None or not stop.is_set():
        try:
            found = consumer.committed(partitions, timeout=5)
        except KafkaException as exc:
            log.warning("committed offsets not available yet (%s); retrying", exc)
            time.sleep(0.5)
            continue
        if all(tp.error is None for tp in found):
            return [
                TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else default)
                for tp in found
            ]
        log.warning("committed offsets not available yet (%s); retrying", found[0].error)
        time.sleep(0.5)
    return [TopicPartition(tp.topic, tp.partition, default) for tp in partitions]


# -- riding out a broker outage -------------------------------------------------------------
# How often a loop waiting for the broker says so, and how long it sleeps between tries.
WAIT_LOG_EVERY_S = 10.0
RETRY_SLEEP_S = 1.0


class Hung(Exception):
    """A client call that did not return within its watchdog's deadline."""


def broker_answers(settings: Settings, timeout_s: float = 5.0) -> bool:
    """Does the broker answer a metadata request within `timeout_s`?"""
    probe = Consumer(consumer_config(settings, None, **{"log_level": 0}))
    try:
        probe.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False
    finally:
        probe.close()


def wait_for_broker(settings: Settings, who: str, stop: threading.Event | None = None) -> bool:
    """Block until the broker answers (True), or `stop` is set (False), saying clearly
    every `WAIT_LOG_EVERY_S` that `who` waits: a process started while the broker is
    down waits for it instead of exiting."""
    started = time.monotonic()
    said = 0.0
    while stop is None or not stop.is_set():
        if broker_answers(settings):
            if said:
                log.warning(
                    "%s: the broker at %s answers after %.0f s; starting",
                    who,
                    settings.kafka,
                    time.monotonic() - started,
                )
            return True
        waited = time.monotonic() - started
        if not said or waited - said >= WAIT_LOG_EVERY_S:
            said = max(waited, 1e-9)
            log.warning(
                "%s: waiting for the broker at %s (no answer for %.0f s so far)",
                who,
                settings.kafka,
                waited,
            )
        if stop is not None:
            stop.wait(RETRY_SLEEP_S)
        else:
            time.sleep(RETRY_SLEEP_S)
    return False


def until_done(
    call: Callable[[], T], what: str, stop: threading.Event | None = None, sleep_s: float = 1.0
) -> T | None:
    """`call()`, retried while it raises KafkaException (the broker down, a coordinator
    moving), until it succeeds or `stop` is set (None then). Fatal client errors are not
    retried: they never heal."""
    failures = 0
    while stop is None or not stop.is_set():
        try:
            return call()
        except KafkaException as exc:
            error = exc.args[0] if exc.args else None
            if isinstance(error, KafkaError) and error.fatal():
                raise
            failures += 1
            if failures == 1 or failures % 10 == 0:
                log.warning("%s failed (%s); retrying (the broker may be down)", what, exc)
            if stop is not None:
                stop.wait(sleep_s)
            else:
                time.sleep(sleep_s)
    return None


def bounded(call: Callable[[], T], deadline_s: float, what: str) -> T:
    """`call()` on a thread of its own, waited for at most `deadline_s`: raises `Hung` if
    it has not returned by then, and leaves it running, abandoned.

    For client calls that can block for ever whatever timeout they are given (librdkafka's
    `send_offsets_to_transaction` when the group coordinator is lost after a broker
    restart: confluentinc/librdkafka#5456 and #5511). The caller must never touch the
    client again after `Hung` (it is inside a call that may still return), only replace
    it. confluent-kafka releases the GIL inside its blocking calls, so the abandoned
    thread costs no CPU."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=body, name=f"bounded {what}", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        raise Hung(f"{what} did not return within {deadline_s:.0f} s")
    if failure:
        raise failure[0]
    return outcome[0]


# How often a consumer out of its group asks whether the broker answers (GroupWatch).
CHECK_EVERY_S = 3.0


class GroupWatch:
    """Tells when a consumer's group membership is stuck while the broker answers.

    After a broker restart a librdkafka consumer can stay out of its group for good:
    seen here as a scheduler that never got its partitions back, so every job stopped
    firing. librdkafka's statistics (`statistics.interval.ms`) report the group state;
    a membership that is not `up`/`steady` for `stuck_after_s` while the broker answers
    metadata is stuck, and the owner replaces the consumer (a new member joins, the
    group rebalances, state is rebuilt on assignment as after any rebalance). While the
    broker does not answer the clock restarts: waiting for the broker is not stuck."""

    def __init__(
        self,
        settings: Settings,
        who: str,
        stuck_after_s: float = 15.0,
        check_every_s: float = CHECK_EVERY_S,
    ):
        self.settings = settings
        self.who = who
        self.stuck_after_s = stuck_after_s
        self.check_every_s = check_every_s
        self.since: float | None = None  # first seen out of the group
        self._checked = 0.0

    def config(self) -> dict[str, Any]:
        """Consumer settings that feed the watch."""
        return {"statistics.interval.ms": 2000, "stats_cb": self._stats}

    def _stats(self, raw: str) -> None:
        try:
            group = json.loads(raw).get("cgrp") or {}
        except ValueError:
            return
        if group.get("state") == "up" and group.get("join_state") == "steady":
            self.since = None
        elif self.since is None:
            self.since = time.monotonic()

    def reset(self) -> None:
        self.since = None

    def stuck(self) -> bool:
        """Checked every loop turn. While out of the group, asks the broker every few
        seconds whether it answers, so the clock restarts within seconds of its return:
        a consumer gets `stuck_after_s` of a live broker to rejoin by itself."""
        now = time.monotonic()
        if self.since is None or now - self.since < self.check_every_s:
            return False
        if now - self._checked >= self.check_every_s:
            # Not watched since the last check (the loop was busy elsewhere, say retrying
            # while the broker was down): the broker's answers count from now on.
            unwatched = now - self._checked > 2 * self.check_every_s + 2.0
            self._checked = now
            if not broker_answers(self.settings, 2.0) or unwatched:
                self.since = time.monotonic()  # waiting for the broker is not stuck
                return False
        if now - self.since < self.stuck_after_s:
            return False
        log.warning(
            "%s: out of its consumer group for %.0f s while the broker answers: "
            "replacing the consumer",
            self.who,
            now - self.since,
        )
        self.since = None
        return True


def abandon_consumer(consumer: Consumer, what: str) -> None:
    """Close a consumer being replaced, bounded: close() can block on a broker that does
    not answer; past the deadline it is left to itself."""
    try:
        bounded(consumer.close, 10.0, f"closing the {what} consumer")
    except (KafkaException, RuntimeError, Hung) as exc:
        log.warning("the old %s consumer did not close cleanly (%s)", what, exc)
