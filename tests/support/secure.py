"""A private secured broker for tests: `KafkaStack(secure=True)` (SASL_SSL, SCRAM users
per role, a local CA, the StandardAuthorizer) on free loopback ports in a temporary state
folder, reusing the shared stack's jars. The suite's shared plaintext broker is never
touched. Each role's settings carry that role's client properties, and each process
started for a role is given its properties file as CRONLOG_KAFKA_CONFIG, exactly as an
operator would."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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


# The session's secured broker under CRONLOG_TEST_SECURE=1 (None: the plaintext one).
ACTIVE: SecureBroker | None = None
# The role a `cronlog` subcommand runs as (connectors/stack/acls.py); others: admin.
ROLE_OF_COMMAND = {
    "scheduler": "node",
    "node": "node",
    "worker": "worker",
    "api": "api",
    "projector": "projector",
    "notifier": "notifier",
}


@contextmanager
def active() -> Iterator[SecureBroker]:
    """A secured broker for the whole session, stopped at its end."""
    global ACTIVE
    broker = SecureBroker(Path(tempfile.mkdtemp(prefix="cronlog-secure-")))
    broker.up()
    ACTIVE = broker
    try:
        yield broker
    finally:
        ACTIVE = None
        broker.down()


def role_env(args: list[str]) -> dict[str, str]:
    """CRONLOG_KAFKA_CONFIG for a `cronlog <args>` process of the session's secured
    broker, by the role its subcommand runs as; nothing on the plaintext broker."""
    if ACTIVE is None:
        return {}
    return ACTIVE.env(ROLE_OF_COMMAND.get(args[0] if args else "", "admin"))
