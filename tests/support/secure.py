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
from connectors.stack.secure import SecureMaterial, add_worker, apply_acls
from streams.settings import Settings
from tests.support.ports import free_ports


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

    def worker(self, worker_id: str, base: Settings) -> tuple[Settings, dict[str, str]]:
        """A native worker provisioned as `cronlog stack add-worker` does (its own user,
        ACLs and inbox under `base`'s prefix): its settings and its process's env."""
        path = add_worker(self.material, self.settings("admin", base), worker_id)
        props = dict(line.split("=", 1) for line in path.read_text().splitlines() if line)
        settings = base.with_(kafka=self.kafka.bootstrap, kafka_config=tuple(sorted(props.items())))
        return settings, {"CRONLOG_KAFKA_CONFIG": str(path)}


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


def role_env(args: list[str], settings: Settings | None = None) -> dict[str, str]:
    """CRONLOG_KAFKA_CONFIG for a `cronlog <args>` process of the session's secured
    broker, by the role its subcommand runs as; nothing on the plaintext broker. A
    worker (`worker --id W`, under `settings`' prefix) is provisioned as its own user."""
    if ACTIVE is None:
        return {}
    role = ROLE_OF_COMMAND.get(args[0] if args else "", "admin")
    if role == "worker" and settings is not None and "--id" in args:
        return ACTIVE.worker(args[args.index("--id") + 1], settings)[1]
    return ACTIVE.env(role)
