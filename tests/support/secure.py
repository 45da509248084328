"""A private secured broker for tests: `KafkaStack(secure=True)` (SASL_SSL, SCRAM users
per role, a local CA, the StandardAuthorizer) on free loopback ports in a temporary state
folder, reusing the shared stack's jars. The suite's shared plaintext broker is never
touched. Each role's settings carry that role's client properties, and each process
started for a role is given its properties file as CRONLOG_KAFKA_CONFIG, exactly as an
operator would."""

from __future__ import annotations

import os
from pathlib import Path

from connectors.stack import StackPaths
from connectors.stack.kafka import KafkaStack
from connectors.stack.secure import SecureMaterial, apply_acls
from streams.settings import Settings
from tests.support.cluster import free_ports


class SecureBroker:
    def __init__(self, state: Path):
        shared = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))
        port, controller = free_ports(2)
        self.kafka = KafkaStack(
            StackPaths(state, libs=shared.kafka_libs), node_ports=[(port, controller)], secure=True
        )
        assert self.kafka.material is not None
        self.material: SecureMaterial = self.kafka.material

    def up(self) -> None:
        self.kafka.up(log=lambda _: None)

    def down(self) -> None:
        self.kafka.down()

    def settings(self, role: str, base: Settings) -> Settings:
        """`base` (prefix, database, partitions) on this broker as `role`."""
        props = self.material.client_properties(role)
        return base.with_(kafka=self.kafka.bootstrap, kafka_config=tuple(sorted(props.items())))

    def env(self, role: str) -> dict[str, str]:
        """What a process of `role` is started with (beside CRONLOG_KAFKA)."""
        return {"CRONLOG_KAFKA_CONFIG": str(self.material.properties_file(role))}

    def grant(self, prefix: str) -> int:
        return apply_acls(self.settings("admin", Settings()), prefix)
