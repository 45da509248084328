"""`cronlog stack`: status, idempotent up, a clean down/up cycle that keeps the data, and a
clear error for a taken port. The cycle runs on a second, private stack (own state folder
and ports) so the shared one keeps serving the other tests."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from connectors.stack import Stack, StackPaths, StackPorts
from connectors.stack.process import port_open
from tests.support.ports import free_port
from tests.support.services import Services

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", *args],
        env={**os.environ, **(env or {})},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def native(services: Services) -> Services:
    if services.source != "native":
        pytest.skip(f"services come from {services.source}, not the native stack")
    return services


def test_status_json_gives_the_addresses(native: Services) -> None:
    result = _cli("stack", "status", "--json")
    assert result.returncode == 0, result.stderr
    status = orjson.loads(result.stdout)
    assert status["kafka"] == native.kafka
    assert status["database_url"] == native.database_url
    assert status["kafka_running"] is True
    assert status["postgres_running"] is True


def test_up_again_reuses_the_running_stack(native: Services) -> None:
    stack = Stack(StackPaths.default(os.environ.get("CRONLOG_STATE_DIR")))
    before = stack.status()
    started = time.monotonic()
    result = _cli("stack", "up")
    assert result.returncode == 0, result.stderr
    assert native.kafka in result.stdout
    assert native.database_url in result.stdout
    assert stack.status().kafka.pid == before.kafka.pid  # same broker process
    assert "starting" not in result.stderr
    assert time.monotonic() - started < 60


@pytest.fixture
def private_stack(native: Services, tmp_path: Path) -> Iterator[Stack]:
    shared = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))
    stack = Stack(
        StackPaths(tmp_path / "state", libs=shared.kafka_libs),
        StackPorts(free_port(), free_port(), free_port()),
    )
    yield stack
    stack.down()
    shutil.rmtree(stack.postgres.base, ignore_errors=True)


def test_down_stops_both_and_up_brings_back_the_same_data(private_stack: Stack) -> None:
    logged: list[str] = []
    status = private_stack.up(logged.append)
    assert status.running
    assert any("formatting Kafka storage" in line for line in logged)
    admin = AdminClient({"bootstrap.servers": status.kafka.bootstrap})
    admin.create_topics([NewTopic("survivor", 2, 1)])["survivor"].result(30)
    with psycopg.connect(status.postgres.database_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE survivor (n int); INSERT INTO survivor VALUES (42)")

    assert private_stack.down() == (True, True)
    after_down = private_stack.status()
    assert not after_down.kafka.running
    assert not after_down.postgres.running
    assert not port_open(int(status.kafka.bootstrap.rsplit(":", 1)[1]))
    assert private_stack.down() == (False, False)  # idempotent

    logged.clear()
    again = private_stack.up(logged.append)
    assert again.running
    assert not any("formatting" in line or "initialising" in line for line in logged)
    topics = AdminClient({"bootstrap.servers": again.kafka.bootstrap}).list_topics(timeout=30)
    assert len(topics.topics["survivor"].partitions) == 2
    with psycopg.connect(again.postgres.database_url) as conn:
        assert conn.execute("SELECT n FROM survivor").fetchone() == (42,)


def test_a_taken_port_is_a_clear_error_before_anything_starts(
    native: Services, tmp_path: Path
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        result = _cli(
            "stack",
            "up",
            env={
                "CRONLOG_STATE_DIR": str(tmp_path / "state"),
                "CRONLOG_STACK_KAFKA_PORT": str(port),
                "CRONLOG_STACK_CONTROLLER_PORT": str(free_port()),
                "CRONLOG_STACK_POSTGRES_PORT": str(free_port()),
            },
        )
    assert result.returncode == 1
    assert f"port {port} is taken by another process" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "state").exists()
