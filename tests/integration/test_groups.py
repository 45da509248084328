"""cronlog's consumer groups get the timing budget's session on the broker (KIP-848
protocol: the session is the group's, not the client's), and a broker that refuses it is
reported with what to change."""

from __future__ import annotations

from dataclasses import replace

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)

from streams.core.timing import TIMING
from streams.groups import GROUPS, ensure_groups, group_settings, refusal_advice
from streams.kafka import admin_config
from streams.settings import Settings
from tests.support.nodes import topics_create


def _described(admin: AdminClient, group: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.GROUP, group)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {key: entries[key].value for key in group_settings()}


def test_every_group_of_a_node_gets_the_budgets_session(settings: Settings) -> None:
    admin = AdminClient(admin_config(settings))
    outcomes = ensure_groups(settings, admin)
    assert [o.group for o in outcomes] == sorted(settings.group(name) for name in GROUPS)
    assert all(o.refused is None for o in outcomes)
    assert refusal_advice(outcomes) is None
    for name in GROUPS:
        assert _described(admin, settings.group(name)) == group_settings()
    assert ensure_groups(settings, admin) == outcomes  # idempotent


def test_a_session_below_the_brokers_minimum_is_refused_with_the_remedy(
    settings: Settings,
) -> None:
    # The local brokers allow sessions down to 2 s; one of 1 s plays a stock broker's
    # 45 s minimum refusing cronlog's 6 s.
    short = replace(TIMING, consumer_session_s=1.0)
    admin = AdminClient(admin_config(settings))
    outcomes = ensure_groups(settings, admin, timing=short)
    assert len(outcomes) == len(GROUPS)
    assert all(o.refused for o in outcomes)
    advice = refusal_advice(outcomes, short)
    assert advice is not None
    assert "group.consumer.min.session.timeout.ms to 1000" in advice
    assert settings.group("ledger") in advice


def test_topics_create_sets_the_groups(settings: Settings) -> None:
    done = topics_create(settings)
    assert done.returncode == 0, done.stderr
    ledger = settings.group("ledger")
    assert f"group   {ledger} (session 6000 ms, heartbeat 1500 ms)" in done.stdout
    assert "warning" not in done.stderr
    admin = AdminClient(admin_config(settings))
    assert _described(admin, settings.group("scheduler")) == group_settings()
