"""The consumer groups' settings on the broker.

cronlog's loops use the KIP-848 group protocol (`group.protocol=consumer`), in which a
member's session and heartbeat interval are settings of its group on the broker, not of
the client. Left to the broker's defaults a node killed for good would keep its
partitions for 45 s; `ensure_groups` gives every group of a node the timing budget's
session and heartbeat (streams/core/timing.py) as dynamic group configs, which need no
broker restart and touch no other application's groups.

A broker whose `group.consumer.min.session.timeout.ms` (45 s by default) or
`group.consumer.min.heartbeat.interval.ms` (5 s) is above them refuses the setting: the
groups then work with the broker's defaults, and the caller is told what to lower.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from streams.core.timing import TIMING, Timing
from streams.settings import Settings

# Every group a node's loops subscribe with (settings.group(name)); workers, the audit
# and rebuilds read by assignment and need no session.
GROUPS = ("ingress", "gate", "ledger", "scheduler", "dispatcher", "projector", "notifier")

SESSION_KEY = "consumer.session.timeout.ms"
HEARTBEAT_KEY = "consumer.heartbeat.interval.ms"


@dataclass(frozen=True, slots=True)
class GroupOutcome:
    group: str
    refused: str | None  # why the broker kept its defaults, None when set


def group_settings(timing: Timing = TIMING) -> dict[str, str]:
    return {
        SESSION_KEY: str(int(timing.consumer_session_s * 1000)),
        HEARTBEAT_KEY: str(int(timing.consumer_heartbeat_s * 1000)),
    }


def ensure_groups(
    settings: Settings, admin: AdminClient, timeout_s: float = 30.0, timing: Timing = TIMING
) -> list[GroupOutcome]:
    """Set the session and heartbeat of cronlog's groups (idempotent)."""
    entries = [
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
        for key, value in group_settings(timing).items()
    ]
    resources = [
        ConfigResource(ResourceType.GROUP, settings.group(name), incremental_configs=entries)
        for name in GROUPS
    ]
    outcomes: list[GroupOutcome] = []
    for resource, future in admin.incremental_alter_configs(
        resources, request_timeout=timeout_s
    ).items():
        try:
            future.result(timeout=timeout_s)
            outcomes.append(GroupOutcome(resource.name, None))
        except KafkaException as exc:
            outcomes.append(GroupOutcome(resource.name, str(exc.args[0].str())))
    return sorted(outcomes, key=lambda o: o.group)


def refusal_advice(outcomes: list[GroupOutcome], timing: Timing = TIMING) -> str | None:
    """What to tell the operator when the broker kept its defaults for some group."""
    refused = [o for o in outcomes if o.refused is not None]
    if not refused:
        return None
    wanted = group_settings(timing)
    return (
        f"the broker refused cronlog's group sessions for {', '.join(o.group for o in refused)}"
        f" ({refused[0].refused}): a node lost for good keeps its partitions for the broker's "
        f"default session (45 s) instead of {int(wanted[SESSION_KEY]) / 1000:g} s. Lower the "
        f"brokers' group.consumer.min.session.timeout.ms to {wanted[SESSION_KEY]} or less and "
        f"group.consumer.min.heartbeat.interval.ms to {wanted[HEARTBEAT_KEY]} or less, then run "
        "`cronlog topics create` again."
    )
