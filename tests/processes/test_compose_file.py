"""compose/docker-compose.yml cannot run here (no Docker engine): it is kept right by
reading, and this test parses it and checks what the native stack guarantees too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from streams.groups import group_settings
from streams.settings import DEFAULT_DATABASE_URL

COMPOSE = Path(__file__).resolve().parents[2] / "compose" / "docker-compose.yml"


def _load() -> dict[str, Any]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    return document


def _env(service: dict[str, Any]) -> dict[str, str]:
    env = service["environment"]
    if isinstance(env, list):
        return dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def test_kafka_is_the_official_image_in_kraft_mode_with_single_node_settings() -> None:
    kafka = _load()["services"]["kafka"]
    assert kafka["image"].startswith("apache/kafka:4.")
    env = _env(kafka)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    assert env["KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS"] == "0"
    assert int(env["KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS"]) <= 2000
    # cronlog's groups use the KIP-848 protocol: the broker holds their session.
    for key, value in group_settings().items():
        assert env[f"KAFKA_GROUP_{key.upper().replace('.', '_')}"] == value
    # Host clients use the contract's default bootstrap address.
    assert "localhost:9092" in env["KAFKA_ADVERTISED_LISTENERS"]
    assert any(str(p).endswith("9092:9092") for p in kafka["ports"])


def test_postgres_matches_the_default_database_url() -> None:
    postgres = _load()["services"]["postgres"]
    env = _env(postgres)
    assert env["POSTGRES_USER"] == "cronlog"
    assert env["POSTGRES_DB"] == "cronlog"
    assert f"cronlog:{env['POSTGRES_PASSWORD']}@" in DEFAULT_DATABASE_URL
    assert any(str(p).endswith("15432:5432") for p in postgres["ports"])
    assert ":15432/" in DEFAULT_DATABASE_URL


def test_every_service_has_a_healthcheck_or_depends_on_one() -> None:
    services = _load()["services"]
    for name, service in services.items():
        assert "healthcheck" in service or "depends_on" in service, name
