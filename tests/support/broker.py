"""A private Kafka broker for tests that kill, stop or restart the broker.

The shared broker of the suite must keep serving the other test modules, so a test that
crashes a broker starts its own: a single-node KRaft broker (``KafkaStack``) on free
loopback ports, in a temporary state folder, reusing the shared stack's jars. Killing it
(SIGKILL) and starting it again on the same log dirs is a broker crash and restart.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from connectors.stack import StackPaths
from connectors.stack.kafka import KafkaStack
from connectors.stack.process import pid_alive
from tests.support.ports import free_port
from tests.support.waiting import eventually


class PrivateBroker:
    def __init__(self, state: Path):
        shared = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))
        self.kafka = KafkaStack(StackPaths(state, libs=shared.kafka_libs), free_port(), free_port())

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    def start(self) -> None:
        self.kafka.up(log=lambda _: None)

    def kill(self) -> None:
        """SIGKILL: no controlled shutdown, no flush; the log dirs stay for a restart."""
        pid = self.kafka.status().pid
        assert pid is not None, "the private broker is not running"
        os.kill(pid, signal.SIGKILL)
        eventually(
            lambda: not pid_alive(pid), f"broker pid {pid} gone after SIGKILL", 30, interval_s=0.1
        )

    def stop(self) -> None:
        self.kafka.down()

    def discard(self) -> None:
        """The end of a throwaway broker: killed, as its data goes with the test's folder
        (a controlled shutdown takes seconds and buys nothing)."""
        if self.kafka.status().pid is not None:
            self.kill()
        for node in self.kafka.nodes:
            node.pid_file.unlink(missing_ok=True)


@contextmanager
def private_broker(tmp: Path) -> Iterator[PrivateBroker]:
    broker = PrivateBroker(tmp / "broker")
    broker.start()
    try:
        yield broker
    finally:
        broker.discard()
