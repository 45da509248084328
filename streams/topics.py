"""The topic catalogue of the public contract (docs/architecture.md, "Topics") and its creation.

Every topic is created with ``CRONLOG_PARTITIONS`` partitions: the ledger's inputs and
state (``commands``, ``job-log``, ``jobs``, ``runs``, ``run-events``) must be
co-partitioned by job_id, and the dispatch/worker topics shard by the same count. The
count is fixed at creation: changing it would move keys to other partitions and break
the per-job ordering the ledger relies on, so :func:`ensure_topics` refuses a mismatch
instead of "fixing" it.

Replication: ``CRONLOG_REPLICATION`` copies of every partition and
``min.insync.replicas`` = ``CRONLOG_MIN_ISR``. By default 3 and 2 on a cluster of three
or more brokers (an acknowledged write is on two brokers, and one broker may fail without
stopping writes), 1 and 1 on one broker (2 and 1 on two). Producers use acks=all, so
min ISR is what an acknowledgement means.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ClusterMetadata,
    ConfigEntry,
    ConfigResource,
    ResourceType,
    TopicMetadata,
)
from confluent_kafka.cimpl import NewTopic

from streams.kafka import admin_config
from streams.settings import Settings

DAY_MS = 24 * 60 * 60 * 1000
FOREVER = -1


@dataclass(frozen=True, slots=True)
class TopicSpec:
    name: str
    purpose: str
    config: dict[str, str] = field(default_factory=dict)


# Why these configs:
# - jobs/runs are the ledger's compacted state: only the newest value per key matters,
#   and a tombstone (null) deletes a finished run. min.compaction.lag keeps recent
#   history readable for a while for debugging; the ledger never depends on it.
# - run-events is the audit log, replayed by `cronlog audit`: kept forever by default.
# - job-log is the ledger's ordered input; its state is checkpointed in jobs/runs, so
#   it need not be kept forever, but a long window lets an operator replay decisions.
# - worker-reports is written only by workers (and the API for HTTP workers): a worker's
#   credentials need no write access to job-log, where registrations are, and ingress
#   relays only claims and outcomes from it (anything else goes to commands.dlq).
# - commands, job-log, worker-reports and heartbeats carry the one clock (message.timestamp.type =
#   LogAppendTime): the broker stamps every record as it appends it, and the ledger takes
#   its "now", ingress a command's time and the failure detector nothing but these
#   stamps and durations on its own monotonic clock, so no producer's clock decides
#   anything. ensure_topics sets it on topics created before it was required.
BROKER_TIME = {"message.timestamp.type": "LogAppendTime"}
# - heartbeats list every attempt their worker holds (the failure detector declares each
#   of them lost when the worker dies): a worker that claimed a burst of 50,000 runs
#   ahead sends ~2 MB beats, beyond the broker's 1 MB default. HEARTBEAT_MAX_BYTES lets
#   one through; the worker holds no more attempts than such a beat can list.
HEARTBEAT_MAX_BYTES = 16 * 1024 * 1024
# - commands.dlq keeps a rejected record's original bytes, base64 in a JSON envelope: a
#   third larger than the record, which may be as large as its own topic allows (the
#   broker's 1 MB default). DLQ_MAX_BYTES takes any of them, so no rejected record can
#   be refused by the DLQ too (it would be read again for ever: a poison pill).
DLQ_MAX_BYTES = 4 * 1024 * 1024
CATALOGUE: tuple[TopicSpec, ...] = (
    TopicSpec(
        "commands",
        "untrusted JSON commands from users, the API and the CLI",
        {"retention.ms": str(7 * DAY_MS), **BROKER_TIME},
    ),
    TopicSpec(
        "commands.dlq",
        "rejected commands: original bytes and a reason",
        {"retention.ms": str(30 * DAY_MS), "max.message.bytes": str(DLQ_MAX_BYTES)},
    ),
    TopicSpec(
        "job-log",
        "the ledger's ordered input, keyed by job_id",
        {"retention.ms": str(90 * DAY_MS), **BROKER_TIME},
    ),
    TopicSpec(
        "worker-reports",
        "workers' claims and outcomes, keyed by job_id; ingress relays them to job-log",
        {"retention.ms": str(7 * DAY_MS), **BROKER_TIME},
    ),
    TopicSpec(
        "run-events", "every job and run transition: the audit log", {"retention.ms": str(FOREVER)}
    ),
    TopicSpec(
        "jobs",
        "compacted job state (specs with fired watermarks)",
        {"cleanup.policy": "compact", "min.compaction.lag.ms": str(60 * 60 * 1000)},
    ),
    TopicSpec(
        "runs",
        "compacted state of live runs",
        {"cleanup.policy": "compact", "min.compaction.lag.ms": str(60 * 60 * 1000)},
    ),
    TopicSpec("dispatch", "runs to place on workers", {"retention.ms": str(DAY_MS)}),
    TopicSpec(
        "heartbeats",
        "worker liveness and free resources",
        {
            "retention.ms": str(DAY_MS),
            "max.message.bytes": str(HEARTBEAT_MAX_BYTES),
            **BROKER_TIME,
        },
    ),
    TopicSpec(
        "worker-inbox", "assignments to workers, keyed by worker_id", {"retention.ms": str(DAY_MS)}
    ),
    TopicSpec(
        "worker-handbacks",
        "assignments a worker had no room for, keyed by run_id: the dispatchers place them again",
        {"retention.ms": str(DAY_MS)},
    ),
    TopicSpec(
        "node-keys",
        "the nodes' placement key (its first record on partition 0): nodes only",
        {"cleanup.policy": "compact"},
    ),
    TopicSpec("run-logs", "stdout/stderr chunks of runs", {"retention.ms": str(7 * DAY_MS)}),
    TopicSpec(
        "notifications.dlq",
        "webhook notifications a receiver kept refusing: body, URL and the last error",
        {"retention.ms": str(30 * DAY_MS)},
    ),
)

NAMES: tuple[str, ...] = tuple(spec.name for spec in CATALOGUE)


class TopicError(RuntimeError):
    """Topics cannot be created as the contract requires. Not retryable as is."""


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    topic: str
    created: bool
    partitions: int
    replication: int = 1


@dataclass(frozen=True, slots=True)
class Replication:
    factor: int
    min_isr: int


def default_replication(brokers: int) -> Replication:
    """Three copies and two in sync once the cluster has three brokers; otherwise a copy
    per broker and one in sync (a min ISR of 2 on two brokers would stop every write
    when either fails). The local stack configures its internal topics the same way."""
    factor = min(brokers, 3)
    return Replication(factor, 2 if factor >= 3 else 1)


def choose_replication(
    settings: Settings, live_brokers: int, broker_default_factor: int = 1
) -> Replication:
    """The replication to create topics with: CRONLOG_REPLICATION / CRONLOG_MIN_ISR when
    set, else :func:`default_replication` of the cluster's size. The size is the larger
    of the live brokers and the broker's own default.replication.factor, so a 3-broker
    cluster with one broker down still asks for 3 copies (and fails clearly) instead of
    silently creating unreplicated topics."""
    default = default_replication(max(live_brokers, broker_default_factor))
    factor = settings.replication if settings.replication is not None else default.factor
    default_min_isr = 2 if factor >= 3 else 1
    min_isr = settings.min_isr if settings.min_isr is not None else default_min_isr
    if factor > live_brokers:
        raise TopicError(
            f"replication factor {factor} needs {factor} brokers but the cluster has "
            f"{live_brokers} running: start the missing brokers, or set CRONLOG_REPLICATION "
            f"to at most {live_brokers}"
        )
    if min_isr > factor:
        raise TopicError(
            f"CRONLOG_MIN_ISR is {min_isr} but topics get {factor} replicas: no write "
            "could ever be acknowledged"
        )
    return Replication(factor, min_isr)


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(admin_config(settings))


def ensure_topics(
    settings: Settings,
    specs: Iterable[TopicSpec] = CATALOGUE,
    timeout_s: float = 30.0,
    admin: AdminClient | None = None,
) -> list[TopicOutcome]:
    """Create the missing topics; verify the partition count of the existing ones.

    Idempotent: a second call creates nothing. Concurrent callers are fine, since a
    topic created by someone else in between reads as "already exists" and is verified.
    """
    admin = admin or _admin(settings)
    specs = list(specs)
    metadata = admin.list_topics(timeout=timeout_s)
    replication = (
        choose_replication(
            settings, len(metadata.brokers), _broker_default_factor(admin, metadata, timeout_s)
        )
        if specs
        else Replication(1, 1)
    )
    outcomes: list[TopicOutcome] = []
    missing: list[NewTopic] = []
    mismatched: list[str] = []
    under_replicated: list[str] = []
    for spec in specs:
        name = settings.topic(spec.name)
        existing = metadata.topics.get(name)
        if existing is not None and existing.error is None:
            count = len(existing.partitions)
            if count != settings.partitions:
                mismatched.append(f"{name} has {count} partitions")
            copies = _replicas(existing)
            if copies < replication.factor:
                under_replicated.append(f"{name} has {copies}")
            outcomes.append(TopicOutcome(name, False, count, copies))
        else:
            missing.append(
                NewTopic(
                    name,
                    num_partitions=settings.partitions,
                    replication_factor=replication.factor,
                    config={**spec.config, _MIN_ISR: str(replication.min_isr)},
                )
            )
    if mismatched:
        raise TopicError(
            f"CRONLOG_PARTITIONS is {settings.partitions} but "
            + "; ".join(mismatched)
            + ". Partition counts are fixed at creation (keys would move between "
            "partitions); use the existing count or a new CRONLOG_TOPIC_PREFIX."
        )
    if under_replicated:
        raise TopicError(
            f"topics should have {replication.factor} replicas but "
            + "; ".join(under_replicated)
            + ". Add replicas with kafka-reassign-partitions, set CRONLOG_REPLICATION to "
            "what they have, or use a new CRONLOG_TOPIC_PREFIX."
        )
    raced: list[str] = []
    if missing:
        futures = admin.create_topics(missing, request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
                outcomes.append(TopicOutcome(name, True, settings.partitions, replication.factor))
            except KafkaException as exc:
                if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                    raise TopicError(f"could not create topic {name}: {exc}") from exc
                raced.append(name)  # a concurrent creator won: verify what it made
    if raced:
        fresh = admin.list_topics(timeout=timeout_s).topics
        for name in raced:
            count = len(fresh[name].partitions)
            if count != settings.partitions:
                raise TopicError(
                    f"{name} was created concurrently with {count} partitions, "
                    f"CRONLOG_PARTITIONS is {settings.partitions}"
                )
            outcomes.append(TopicOutcome(name, False, count, _replicas(fresh[name])))
    # Topics created just now have their configs; check the others (made by an older
    # cronlog or a concurrent creator). Asking about a new topic at once can also fail on
    # a cluster: the broker asked may not know it yet.
    created = {o.topic for o in outcomes if o.created}
    older = [spec for spec in specs if settings.topic(spec.name) not in created]
    _require_broker_time(
        admin, [settings.topic(s.name) for s in older if s.config.get(_TIMESTAMP_TYPE)], timeout_s
    )
    _require_min_isr(admin, [settings.topic(s.name) for s in older], replication, timeout_s)
    _require_size_limits(admin, {settings.topic(s.name): s for s in older}, timeout_s)
    order = {settings.topic(spec.name): i for i, spec in enumerate(specs)}
    return sorted(outcomes, key=lambda o: order[o.topic])


_TIMESTAMP_TYPE = "message.timestamp.type"
_LOG_APPEND_TIME = "LogAppendTime"
_MIN_ISR = "min.insync.replicas"


def _replicas(topic: TopicMetadata) -> int:
    return min((len(p.replicas) for p in topic.partitions.values()), default=0)


def _broker_default_factor(admin: AdminClient, metadata: ClusterMetadata, timeout_s: float) -> int:
    """The cluster's default.replication.factor (any broker's; 1 when unreadable)."""
    if not metadata.brokers:
        return 1
    broker = str(min(metadata.brokers))
    resource = ConfigResource(ResourceType.BROKER, broker)
    try:
        configs = admin.describe_configs([resource], request_timeout=timeout_s)[resource]
        return int(configs.result(timeout=timeout_s)["default.replication.factor"].value)
    except (KafkaException, KeyError, ValueError):
        return 1  # no permission to describe broker configs: size by live brokers


def _require_min_isr(
    admin: AdminClient, names: list[str], replication: Replication, timeout_s: float
) -> None:
    """Set min.insync.replicas on existing topics that differ (created before it was
    configured, or with another CRONLOG_MIN_ISR). Safe online: it changes only which
    acknowledgements the brokers give from now on."""
    if not names:
        return
    wanted = str(replication.min_isr)
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, name) for name in names], request_timeout=timeout_s
    )
    lagging = [
        resource.name
        for resource, future in futures.items()
        if future.result(timeout=timeout_s)[_MIN_ISR].value != wanted
    ]
    _set_config(admin, lagging, _MIN_ISR, wanted, timeout_s)


def _require_size_limits(admin: AdminClient, specs: dict[str, TopicSpec], timeout_s: float) -> None:
    """Set max.message.bytes on existing topics whose contract names one and that differ
    (made before it was required). Safe online: it only lets larger records in."""
    key = "max.message.bytes"
    named = {name: spec.config[key] for name, spec in specs.items() if key in spec.config}
    if not named:
        return
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, name) for name in named], request_timeout=timeout_s
    )
    for resource, future in futures.items():
        if future.result(timeout=timeout_s)[key].value != named[resource.name]:
            _set_config(admin, [resource.name], key, named[resource.name], timeout_s)


def _set_config(
    admin: AdminClient, names: list[str], key: str, value: str, timeout_s: float
) -> None:
    """Set one config on these topics (incrementally: their other configs stay)."""
    if not names:
        return
    entry = ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
    resources = [
        ConfigResource(ResourceType.TOPIC, name, incremental_configs=[entry]) for name in names
    ]
    for resource, future in admin.incremental_alter_configs(
        resources, request_timeout=timeout_s
    ).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise TopicError(f"could not set {key} on {resource.name}: {exc}") from exc


def _require_broker_time(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """Set LogAppendTime on these topics where it is not set yet (topics made by an older
    cronlog have CreateTime, which would let a producer's clock into the ledger's
    decisions), and wait until the broker applies it."""
    if not names:
        return
    deadline = time.monotonic() + timeout_s
    lagging = _not_broker_time(admin, names, timeout_s)
    if not lagging:
        return
    _set_config(admin, lagging, _TIMESTAMP_TYPE, _LOG_APPEND_TIME, timeout_s)
    while lagging := _not_broker_time(admin, lagging, timeout_s):
        if time.monotonic() > deadline:
            raise TopicError(f"{_TIMESTAMP_TYPE} not applied in time on {', '.join(lagging)}")
        time.sleep(0.1)


def _not_broker_time(admin: AdminClient, names: list[str], timeout_s: float) -> list[str]:
    futures = admin.describe_configs(
        [ConfigResource(ResourceType.TOPIC, name) for name in names], request_timeout=timeout_s
    )
    return [
        resource.name
        for resource, future in futures.items()
        if future.result(timeout=timeout_s)[_TIMESTAMP_TYPE].value != _LOG_APPEND_TIME
    ]


def delete_topics(settings: Settings, timeout_s: float = 30.0) -> list[str]:
    """Delete every contract topic under the prefix (tests clean up with this)."""
    admin = _admin(settings)
    present = admin.list_topics(timeout=timeout_s).topics
    names = [settings.topic(n) for n in NAMES if settings.topic(n) in present]
    if not names:
        return []
    for future in admin.delete_topics(names, request_timeout=timeout_s).values():
        future.result(timeout=timeout_s)
    return names
