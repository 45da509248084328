"""The native local stack: a real Kafka broker (or a three-broker cluster) and PostgreSQL on
loopback, no Docker.

``cronlog stack up|down|status`` drives it; ``make run`` and ``make test`` call ``up``.
Docker users have compose/docker-compose.yml instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from connectors.stack.kafka import CONTROLLER_PORT, KafkaStack, KafkaStatus
from connectors.stack.kafka import PORT as KAFKA_PORT
from connectors.stack.paths import StackPaths
from connectors.stack.postgres import PORT as POSTGRES_PORT
from connectors.stack.postgres import PostgresStack, PostgresStatus
from connectors.stack.process import Log, StackError
from connectors.stack.secure import apply_acls
from connectors.stack.tools import ensure_test_tools
from streams.settings import Settings


@dataclass(frozen=True, slots=True)
class StackStatus:
    kafka: KafkaStatus
    postgres: PostgresStatus
    state_dir: str

    @property
    def running(self) -> bool:
        return self.kafka.running and self.postgres.running

    def as_json(self) -> dict[str, object]:
        # "kafka" and "database_url" are the contract (scripts read them); the rest
        # is for humans and scripts that want detail.
        return {
            "kafka": self.kafka.bootstrap,
            "database_url": self.postgres.database_url,
            "kafka_running": self.kafka.running,
            "kafka_brokers": [
                {"node_id": n.node_id, "bootstrap": n.bootstrap, "running": n.running}
                for n in self.kafka.nodes
            ],
            "postgres_running": self.postgres.running,
            "state_dir": self.state_dir,
        }


@dataclass(frozen=True, slots=True)
class StackPorts:
    kafka: int = KAFKA_PORT
    controller: int = CONTROLLER_PORT
    postgres: int = POSTGRES_PORT


class Stack:
    def __init__(
        self,
        paths: StackPaths,
        ports: StackPorts = StackPorts(),
        brokers: int | None = None,
        secure: bool = False,
    ):
        """``brokers``: None means what the state folder already holds (one if new).
        ``secure``: the SASL_SSL broker with per-role users and ACLs (its own folder)."""
        self.paths = paths
        self.secure = secure
        self.kafka = KafkaStack(paths, ports.kafka, ports.controller, brokers, secure=secure)
        self.postgres = PostgresStack(paths, ports.postgres)

    def grant(self, prefix: str) -> int:
        """The roles' ACLs for an installation's topic prefix (secure stacks only)."""
        material = self.kafka.material
        if material is None:
            raise StackError("ACLs need the secured broker: cronlog stack up --secure")
        props = material.client_properties("admin")
        admin = Settings(kafka=self.kafka.bootstrap, kafka_config=tuple(sorted(props.items())))
        return apply_acls(admin, prefix)

    def up(self, log: Log = print) -> StackStatus:
        # Check the broker count and every port before touching anything, so a mistake
        # fails fast.
        self.kafka.check_count()
        self.kafka.check_ports()
        self.postgres.check_port()
        self.paths.state.mkdir(parents=True, exist_ok=True)
        self.postgres.up(log)
        self.kafka.up(log)
        ensure_test_tools(log)  # best effort: faketime for the clock-skew tests
        return self.status()

    def down(self) -> tuple[bool, bool]:
        """Stop PostgreSQL and the broker, the plaintext one and the secured one both."""
        errors: list[str] = []
        stopped: list[bool] = []
        other_dir = self.paths.kafka if self.secure else self.paths.kafka_secure
        try:
            other_ran = (
                KafkaStack(self.paths, secure=not self.secure).down()
                if other_dir.exists()
                else False
            )
        except StackError as exc:
            errors.append(str(exc))
            other_ran = True
        for part in (self.kafka, self.postgres):
            try:
                stopped.append(part.down())
            except StackError as exc:  # stop the other part all the same
                errors.append(str(exc))
                stopped.append(True)
        if errors:
            raise StackError("; ".join(errors))
        return stopped[0] or other_ran, stopped[1]

    def status(self) -> StackStatus:
        return StackStatus(self.kafka.status(), self.postgres.status(), str(self.paths.state))


__all__ = ["Stack", "StackError", "StackPaths", "StackPorts", "StackStatus"]
