"""The real Kafka broker and PostgreSQL the integration tests talk to.

In order of preference: CRONLOG_KAFKA and CRONLOG_DATABASE_URL when both are set (an
existing installation); the native local stack (`cronlog stack up`, Java + Debian
packages); testcontainers when neither Java nor the native stack is available but a
Docker engine is.

CRONLOG_TEST_SECURE=1 (`make test-secure`): the tests that run over it talk to a private
secured broker instead (tests/support/secure.py: SASL_SSL, a user per role, the ACLs),
every process with its role's credentials, the tests' own clients as the admin user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from connectors.stack import Stack, StackPaths
from tests.support import secure


@dataclass(frozen=True, slots=True)
class Services:
    kafka: str
    database_url: str
    source: str  # "env", "native" or "testcontainers"
    secured: secure.SecureBroker | None = None  # CRONLOG_TEST_SECURE=1


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    with suppress(OSError, subprocess.TimeoutExpired):
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
        return done.returncode == 0
    return False


@contextmanager
def real_services() -> Iterator[Services]:
    kafka, database = os.environ.get("CRONLOG_KAFKA"), os.environ.get("CRONLOG_DATABASE_URL")
    if kafka and database:
        yield Services(kafka, database, "env")
        return
    if shutil.which("java") is None and _docker_engine():
        with _containers() as services:
            yield services
        return
    status = Stack(StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))).up(log=lambda _: None)
    if os.environ.get("CRONLOG_TEST_SECURE") == "1":
        with secure.active() as broker:
            yield Services(broker.kafka.bootstrap, status.postgres.database_url, "secure", broker)
        return
    yield Services(status.kafka.bootstrap, status.postgres.database_url, "native")


@contextmanager
def _containers() -> Iterator[Services]:
    # Imported here: only Docker users reach this path.
    from testcontainers.kafka import KafkaContainer
    from testcontainers.postgres import PostgresContainer

    kafka = (
        KafkaContainer("confluentinc/cp-kafka:8.0.0")  # Kafka 4.0: the KIP-848 groups
        .with_kraft()
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
        .with_env("KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS", "2000")
        .with_env("KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS", "2000")
        .with_env("KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS", "500")
        .with_env("KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS", "6000")
        .with_env("KAFKA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS", "1500")
    )
    postgres = PostgresContainer(
        "postgres:16", username="cronlog", password="cronlog", dbname="cronlog", driver=None
    )
    with kafka, postgres:
        yield Services(
            kafka.get_bootstrap_server(), postgres.get_connection_url(), "testcontainers"
        )
