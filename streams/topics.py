"""The topic catalogue of the public contract (design.md section 2) and its creation.

Every topic is created with ``CRONLOG_PARTITIONS`` partitions: the ledger's inputs and
state (``commands``, ``job-log``, ``jobs``, ``runs``, ``run-events``) must be
co-partitioned by job_id, and the dispatch/worker topics shard by the same count. The
count is fixed at creation: changing it would move keys to other partitions and break
the per-job ordering the ledger relies on, so :func:`ensure_topics` refuses a mismatch
instead of "fixing" it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from confluent_kafka.cimpl import NewTopic

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
# - commands, job-log and heartbeats carry the one clock (message.timestamp.type =
#   LogAppendTime): the broker stamps every record as it appends it, and the ledger takes
#   its "now", ingress a command's time and the failure detector nothing but these
#   stamps and durations on its own monotonic clock, so no producer's clock decides
#   anything. ensure_topics sets it on topics created before it was required.
BROKER_TIME = {"message.timestamp.type": "LogAppendTime"}
CATALOGUE: tuple[TopicSpec, ...] = (
    TopicSpec(
        "commands",
        "untrusted JSON commands from users, the API and the CLI",
        {"retention.ms": str(7 * DAY_MS), **BROKER_TIME},
    ),
    TopicSpec(
        "commands.dlq",
        "rejected commands: original bytes and a reason",
        {"retention.ms": str(30 * DAY_MS)},
    ),
    TopicSpec(
        "job-log",
        "the ledger's ordered input, keyed by job_id",
        {"retention.ms": str(90 * DAY_MS), **BROKER_TIME},
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
        {"retention.ms": str(DAY_MS), **BROKER_TIME},
    ),
    TopicSpec(
        "worker-inbox", "assignments to workers, keyed by worker_id", {"retention.ms": str(DAY_MS)}
    ),
    TopicSpec("run-logs", "stdout/stderr chunks of runs", {"retention.ms": str(7 * DAY_MS)}),
)

NAMES: tuple[str, ...] = tuple(spec.name for spec in CATALOGUE)


class TopicError(RuntimeError):
    """Topics cannot be created as the contract requires. Not retryable as is."""


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    topic: str
    created: bool
    partitions: int


def _admin(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.kafka})


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
    outcomes: list[TopicOutcome] = []
    missing: list[NewTopic] = []
    mismatched: list[str] = []
    for spec in specs:
        name = settings.topic(spec.name)
        existing = metadata.topics.get(name)
        if existing is not None and existing.error is None:
            count = len(existing.partitions)
            if count != settings.partitions:
                mismatched.append(f"{name} has {count} partitions")
            outcomes.append(TopicOutcome(name, False, count))
        else:
            missing.append(
                NewTopic(
                    name,
                    num_partitions=settings.partitions,
                    replication_factor=-1,
                    config=dict(spec.config),
                )
            )
    if mismatched:
        raise TopicError(
            f"CRONLOG_PARTITIONS is {settings.partitions} but "
            + "; ".join(mismatched)
            + ". Partition counts are fixed at creation (keys would move between "
            "partitions); use the existing count or a new CRONLOG_TOPIC_PREFIX."
        )
    raced: list[str] = []
    if missing:
        futures = admin.create_topics(missing, request_timeout=timeout_s)
        for name, future in futures.items():
            try:
                future.result(timeout=timeout_s)
                outcomes.append(TopicOutcome(name, True, settings.partitions))
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
            outcomes.append(TopicOutcome(name, False, count))
    _require_broker_time(
        admin, [settings.topic(s.name) for s in specs if s.config.get(_TIMESTAMP_TYPE)], timeout_s
    )
    order = {settings.topic(spec.name): i for i, spec in enumerate(specs)}
    return sorted(outcomes, key=lambda o: order[o.topic])


_TIMESTAMP_TYPE = "message.timestamp.type"
_LOG_APPEND_TIME = "LogAppendTime"


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
    entry = ConfigEntry(
        _TIMESTAMP_TYPE, _LOG_APPEND_TIME, incremental_operation=AlterConfigOpType.SET
    )
    resources = [
        ConfigResource(ResourceType.TOPIC, name, incremental_configs=[entry]) for name in lagging
    ]
    for resource, future in admin.incremental_alter_configs(
        resources, request_timeout=timeout_s
    ).items():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise TopicError(f"could not set {_TIMESTAMP_TYPE} on {resource.name}: {exc}") from exc
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
