"""Where a worker's messages go: its own inbox topic, or the shared one.

A Kafka-native worker reads only its private topic ``worker-inbox.<worker id>`` (one
partition), which it makes before its first heartbeat (`ensure_private_inbox`). On a
secured cluster each native worker has its own principal and may read that topic alone
(connectors/stack/acls.py), so the seals of its placements reach nobody else, and with
them the power to claim its attempts or report on them (streams/core/seals.py). HTTP
workers have no private topic: their messages go to the shared ``worker-inbox``, which
only the API reads, and the API hands each worker its own messages (by its token).

The ledger and the dispatchers route by what the broker's metadata says (`Inboxes`): a
worker id whose private topic exists gets it, any other the shared topic. A positive
answer is kept for good (an inbox topic is never deleted while its worker may have work);
a negative one for `MISS_TTL_S`, which is why a worker that has just made its inbox waits
that long before it heartbeats (no node routes to the shared topic what it will read from
its own). A metadata lookup that fails raises: the ledger aborts the transaction and the
dispatcher counts the assignment undelivered, rather than send a message where its
worker will never read it.
"""

from __future__ import annotations

import logging
import re
import threading
import time

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from streams.kafka import KAFKA_CLIENTS, Clients, admin_config
from streams.settings import Settings
from streams.topics import CATALOGUE, choose_replication

log = logging.getLogger("cronlog.inboxes")
# The worker ids a private inbox can be named after (Kafka's topic name alphabet).
WORKER_ID = re.compile(r"[A-Za-z0-9._-]{1,150}")
MISS_TTL_S = 1.0
REFRESH_MIN_S = 0.5  # at most two metadata lookups a second, whatever misses
_INBOX_CONFIG = next(spec.config for spec in CATALOGUE if spec.name == "worker-inbox")


def private_inbox(settings: Settings, worker_id: str) -> str | None:
    """The name of `worker_id`'s private inbox topic (None: the id cannot name one)."""
    if WORKER_ID.fullmatch(worker_id) is None:
        return None
    return f"{settings.topic('worker-inbox')}.{worker_id}"


class Inboxes:
    """The inbox topic of each worker, from the broker's metadata (thread-safe)."""

    def __init__(self, settings: Settings, admin: AdminClient | None = None):
        self.settings = settings
        self.shared = settings.topic("worker-inbox")
        self.admin = admin or AdminClient(admin_config(settings))
        self.private: set[str] = set()
        self.missing: dict[str, float] = {}  # worker id -> until when it reads as missing
        self.refreshed = 0.0
        self.lock = threading.Lock()

    def topic(self, worker_id: str) -> str:
        name = private_inbox(self.settings, worker_id)
        if name is None:
            return self.shared
        with self.lock:
            if name in self.private:
                return name
            now = time.monotonic()
            if now < self.missing.get(worker_id, 0.0):
                return self.shared
            if now - self.refreshed >= REFRESH_MIN_S:
                self._refresh()
            if name in self.private:
                return name
            self.missing[worker_id] = now + MISS_TTL_S
            if len(self.missing) > 100_000:  # ids that never had an inbox: forget them
                self.missing = {w: t for w, t in self.missing.items() if t > now}
            return self.shared

    def _refresh(self) -> None:
        """Every private inbox topic the broker lists (raises KafkaException if it
        cannot answer: the caller must not guess)."""
        topics = self.admin.list_topics(timeout=5).topics
        start = self.shared + "."
        self.private.update(n for n, t in topics.items() if n.startswith(start) and not t.error)
        self.refreshed = time.monotonic()


def ensure_private_inbox(
    settings: Settings,
    worker_id: str,
    timeout_s: float = 30.0,
    clients: Clients = KAFKA_CLIENTS,
) -> bool:
    """Make `worker_id`'s private inbox topic unless it exists. True if it was made now
    (its worker then waits `MISS_TTL_S` before heartbeating). Raises ValueError for an id
    that cannot name a topic, PermissionError if the broker lets this principal neither
    see nor make it (a secured cluster: provision the worker first)."""
    name = private_inbox(settings, worker_id)
    if name is None:
        raise ValueError(
            f"worker id {worker_id!r} must be 1 to 150 letters, digits, '.', '_' or '-' "
            "(it names the worker's inbox topic)"
        )
    admin = clients.admin(admin_config(settings))
    metadata = admin.list_topics(timeout=timeout_s)
    found = metadata.topics.get(name)
    if found is not None and found.error is None:
        return False
    replication = choose_replication(settings, len(metadata.brokers))
    topic = NewTopic(
        name,
        num_partitions=1,
        replication_factor=replication.factor,
        config={**_INBOX_CONFIG, "min.insync.replicas": str(replication.min_isr)},
    )
    try:
        admin.create_topics([topic], request_timeout=timeout_s)[name].result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0]
        if error.name() == "TOPIC_ALREADY_EXISTS":
            return False
        if error.name() == "TOPIC_AUTHORIZATION_FAILED":
            raise PermissionError(
                f"worker {worker_id} has no inbox topic {name} and may not make it: "
                f"provision the worker first (cronlog stack add-worker {worker_id}, or "
                "create the topic and grant its principal Read on it)"
            ) from None
        raise
    _await_listed(admin, name, timeout_s)
    log.info("made the private inbox %s of worker %s", name, worker_id)
    return True


def _await_listed(admin: AdminClient, name: str, timeout_s: float) -> None:
    """Until the broker's metadata lists the topic just made (the controller has it at
    once; a broker's metadata follows a moment later, longer on a busy machine): the
    worker's `MISS_TTL_S` wait before it heartbeats must begin once routers can see it,
    or one that looks now caches a miss and routes its messages to the shared inbox."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = admin.list_topics(name, timeout=timeout_s).topics.get(name)
        if found is not None and found.error is None and found.partitions:
            return
        if time.monotonic() >= deadline:
            raise KafkaException(
                f"the inbox {name} was made but is not listed after {timeout_s:g} s"
            )
        time.sleep(0.05)
