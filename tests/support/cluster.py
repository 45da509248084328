"""A private three-broker Kafka cluster for tests and benchmarks that kill brokers.

Like tests/support/broker.py, but three KRaft nodes (each broker and controller, the
three the controller quorum) from ``KafkaStack(brokers=3)`` on free loopback ports in a
temporary state folder, reusing the shared stack's jars. ``kill(n)`` is a crash
(SIGKILL), ``stop(n)`` a controlled shutdown, ``start(n)`` brings that node back on the
same log dirs. The shared broker of the suite is never touched.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from connectors.stack import StackPaths
from connectors.stack.kafka import KafkaStack
from connectors.stack.process import pid_alive, stop_pid
from streams.settings import Settings
from tests.support.ports import free_ports
from tests.support.waiting import eventually, until_passes

BROKERS = 3


def java_hash(text: str) -> int:
    """Java's String.hashCode: 31-fold over UTF-16 code units, in 32-bit arithmetic."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def java_abs(n: int) -> int:
    """Kafka's Utils.abs: Math.abs, but 0 for Integer.MIN_VALUE."""
    return 0 if n == -(1 << 31) else abs(n)


class PrivateCluster:
    def __init__(self, state: Path, brokers: int = BROKERS, host: str = "127.0.0.1"):
        shared = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))
        ports = free_ports(2 * brokers)
        self.kafka = KafkaStack(
            StackPaths(state, libs=shared.kafka_libs),
            brokers=brokers,
            node_ports=[(ports[2 * i], ports[2 * i + 1]) for i in range(brokers)],
            host=host,
        )

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap

    @property
    def node_ids(self) -> list[int]:
        return [node.node_id for node in self.kafka.nodes]

    def up(self) -> None:
        """Start every node that is not running and wait for the whole cluster."""
        self.kafka.up(log=lambda _: None)

    def start(self, node_id: int) -> None:
        self.kafka.start_node(node_id, log=lambda _: None)

    def pid(self, node_id: int) -> int | None:
        return self.kafka.node(node_id).pid()

    def kill(self, node_id: int) -> None:
        """SIGKILL: no controlled shutdown, no flush; the log dirs stay for a restart."""
        pid = self.pid(node_id)
        assert pid is not None, f"broker {node_id} is not running"
        os.kill(pid, signal.SIGKILL)
        eventually(
            lambda: not pid_alive(pid),
            f"broker {node_id} (pid {pid}) gone after SIGKILL",
            30,
            interval_s=0.1,
        )

    def stop(self, node_id: int) -> None:
        """A controlled shutdown (SIGTERM): leadership moves away before the node exits."""
        pid = self.pid(node_id)
        assert pid is not None, f"broker {node_id} is not running"
        assert not stop_pid(pid, grace_s=60), f"broker {node_id} ignored SIGTERM for 60 s"

    def down(self) -> None:
        """The end of a throwaway cluster: every node killed (its data is deleted with the
        test's folder, so a controlled shutdown buys nothing; in CI one node of three
        stopped together once hung in it for over 60 s)."""
        for node_id in self.node_ids:
            if self.pid(node_id) is not None:
                self.kill(node_id)
        for node in self.kafka.nodes:
            node.pid_file.unlink(missing_ok=True)

    # -- who leads what ------------------------------------------------------------------
    def _admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 3000})

    def leaders(self, prefix: str) -> Counter[int]:
        """How many partitions of the topics under this prefix each broker leads."""
        metadata = self._admin().list_topics(timeout=15)
        led: Counter[int] = Counter()
        for name, topic in metadata.topics.items():
            if name.startswith(prefix):
                for partition in topic.partitions.values():
                    if partition.leader >= 0:
                        led[partition.leader] += 1
        return led

    def leader_of(self, topic: str, partitions: list[int]) -> int:
        """The broker leading the most of these partitions of `topic`."""
        metadata = self._admin().list_topics(topic, timeout=15)
        led = Counter(metadata.topics[topic].partitions[p].leader for p in partitions)
        return max(led, key=lambda n: (led[n], -n))

    def coordinator(self, key: str, internal_topic: str) -> int:
        """The broker coordinating `key` (a transactional id on `__transaction_state`,
        a group id on `__consumer_offsets`): the leader of the partition the broker
        hashes it to, as Kafka does (Utils.abs(key.hashCode()) % partitions)."""
        metadata = self._admin().list_topics(internal_topic, timeout=15)
        partitions = metadata.topics[internal_topic].partitions
        return partitions[java_abs(java_hash(key)) % len(partitions)].leader

    def group_coordinator(self, group_id: str, timeout_s: float = 60) -> int:
        """The broker coordinating a group, as the brokers say (asked again while a
        coordinator that just moved is loading the group)."""
        found: list[int] = []

        def answered() -> None:
            admin = self._admin()  # held: a client collected early never completes its futures
            future = admin.describe_consumer_groups([group_id], request_timeout=5)
            try:
                found.append(int(future[group_id].result(timeout=10).coordinator.id))
            except Exception as exc:  # a coordinator moving or loading: ask again
                raise AssertionError(f"no coordinator of {group_id} known: {exc!r}") from exc

        until_passes(answered, timeout_s, interval_s=1)
        return found[0]

    def busiest_leader(self, prefix: str, among: list[int] | None = None) -> int:
        """The broker leading the most partitions under the prefix (of `among`)."""
        led = self.leaders(prefix)
        candidates = among or self.node_ids
        return max(candidates, key=lambda n: (led[n], -n))

    def under_replicated(self, prefix: str = "") -> list[str]:
        """Partitions (under the prefix, and the internal topics) missing an in-sync
        replica or a leader."""
        metadata = self._admin().list_topics(timeout=15)
        found = []
        for name, topic in metadata.topics.items():
            if not (name.startswith(prefix) or name.startswith("__")):
                continue
            for p in topic.partitions.values():
                if p.leader < 0 or len(p.isrs) < len(p.replicas):
                    found.append(f"{name}[{p.id}]")
        return found

    def wait_in_sync(self, prefix: str, timeout_s: float = 120) -> float:
        """Wait until every replica is back in sync; returns the seconds it took."""
        started = time.monotonic()

        def in_sync() -> None:
            try:
                lagging = self.under_replicated(prefix)
            except Exception:  # noqa: BLE001 - a broker in mid-start: ask again
                lagging = ["?"]
            assert not lagging, f"replicas not in sync after {timeout_s:.0f} s: {lagging}"

        until_passes(in_sync, timeout_s, interval_s=0.5)
        return time.monotonic() - started


@contextmanager
def private_cluster(
    tmp: Path, brokers: int = BROKERS, host: str = "127.0.0.1"
) -> Iterator[PrivateCluster]:
    """``host``: the address the brokers serve clients on (a veth end, for tests that
    put processes in network namespaces: tests/support/netns.py)."""
    cluster = PrivateCluster(tmp / "cluster", brokers, host)
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.down()


def on_brokers(settings: Settings, bootstrap: str) -> Settings:
    """The suite's settings for this module (its topic prefix, database, partitions) on
    private brokers."""
    return Settings(
        kafka=bootstrap,
        database_url=settings.database_url,
        topic_prefix=settings.topic_prefix,
        partitions=settings.partitions,
    )


@dataclass
class ClusterWorld:
    """A replicated private cluster with the contract's topics, the module's settings on
    it, and a folder for the processes' logs."""

    cluster: PrivateCluster
    settings: Settings
    logs: Path


@contextmanager
def cluster_world(settings: Settings, tmp: Path) -> Iterator[ClusterWorld]:
    from streams.topics import ensure_topics

    with private_cluster(tmp) as cluster:
        private = on_brokers(settings, cluster.bootstrap)
        replicas = {o.replication for o in ensure_topics(private)}
        assert replicas == {BROKERS}, replicas
        logs = tmp / "logs"
        logs.mkdir()
        yield ClusterWorld(cluster, private, logs)
