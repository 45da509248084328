"""A real Apache Kafka 4.x cluster in KRaft mode, run from Maven Central jars on local Java.

The jars come from ``compose/kafka/pom.xml`` via ``mvn dependency:copy-dependencies``
(cached in ~/.m2, so later runs are offline-fast). Storage is formatted once; the log
dirs live under the state folder and survive ``down``/``up``.

One broker by default; ``brokers=3`` runs three nodes, each a combined broker and
controller, the three together the controller quorum (static voters), so any one node
may die and the cluster keeps a quorum and a leader for every partition. Node i (from 0)
listens on ``port + 2i`` (clients) and ``controller_port + 2i`` (quorum): with the
defaults 9092/9094/9096 and 9093/9095/9097. A one-broker state folder keeps its
historical layout (``kafka/``); a cluster gets ``kafka/node-1`` ... ``kafka/node-N`` and
``kafka/cluster.json`` (broker count and cluster id). The broker count of a state folder
is fixed once formatted.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from string import Template

from confluent_kafka.admin import AdminClient

from connectors.private_files import write_private
from connectors.stack.paths import KAFKA_ASSETS, StackPaths
from connectors.stack.process import (
    Log,
    StackError,
    cmdline,
    pid_alive,
    port_open,
    read_pid,
    run,
    stop_pid,
    wait_until,
)
from connectors.stack.secure import (
    SecureMaterial,
    ensure_material,
    listener_config,
    scram_format_args,
)

PORT = 9092
CONTROLLER_PORT = 9093
# Three JVMs on a small machine: a modest heap each; a single broker gets more room.
SINGLE_HEAP = ("-Xms256m", "-Xmx1g")
CLUSTER_HEAP = ("-Xms256m", "-Xmx512m")
JVM_OPTS = ("-XX:+UseG1GC", "-Djava.awt.headless=true")
MIN_JAVA = 17
MAX_BROKERS = 9
LOG4J_CONFIG = KAFKA_ASSETS / "log4j2.properties"


def replication_for(brokers: int) -> tuple[int, int]:
    """(replication factor, min.insync.replicas) for a cluster of this many brokers:
    three copies and two in sync once there are three brokers (one may fail without
    losing an acknowledged write or blocking producers); otherwise one copy per broker
    and one in sync, since a min ISR of 2 on two brokers would stop writes as soon as
    either fails."""
    replication = min(brokers, 3)
    return replication, 2 if replication >= 3 else 1


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node_id: int
    bootstrap: str
    pid: int | None
    running: bool


@dataclass(frozen=True, slots=True)
class KafkaStatus:
    running: bool
    bootstrap: str  # every node, comma-separated: the value for CRONLOG_KAFKA
    pid: int | None  # the first node's (one-broker stacks: the broker's)
    nodes: tuple[NodeStatus, ...] = ()

    @property
    def brokers(self) -> int:
        return len(self.nodes)


class KafkaNode:
    """One KRaft process (broker and controller) of the local cluster."""

    def __init__(
        self,
        node_id: int,
        directory: Path,
        port: int,
        controller_port: int,
        client: dict[str, str] | None = None,
        host: str = "127.0.0.1",
    ):
        self.node_id = node_id
        self.dir = directory
        self.host = host  # where clients reach it (its controller stays on loopback)
        self.port = port
        self.controller_port = controller_port
        self.client = client or {}  # how an admin client reaches it (TLS and SASL)
        self.config = directory / "server.properties"
        self.pid_file = directory / "kafka.pid"
        self.logs = directory / "logs"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def pid(self) -> int | None:
        """The pid of the broker this state folder started, if it still runs."""
        pid = read_pid(self.pid_file)
        if pid and pid_alive(pid) and str(self.config) in cmdline(pid):
            return pid
        return None

    def formatted(self) -> bool:
        return (self.dir / "data" / "meta.properties").exists()

    def answers(self, timeout_s: float, brokers: int) -> bool:
        """This node serves metadata that lists the whole cluster."""
        if not port_open(self.port, self.host):
            return False
        try:
            admin = AdminClient(
                {"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000, **self.client}
            )
            metadata = admin.list_topics(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            return False
        return len(metadata.brokers) >= brokers


class KafkaStack:
    def __init__(
        self,
        paths: StackPaths,
        port: int = PORT,
        controller_port: int = CONTROLLER_PORT,
        brokers: int | None = None,
        node_ports: Sequence[tuple[int, int]] | None = None,
        secure: bool = False,
        host: str = "127.0.0.1",
    ):
        """``brokers``: None means what the state folder holds (one if it is new).
        ``host``: the address clients reach the brokers on (tests of network faults
        give one end of a veth pair, reachable from the namespace at its other end).
        ``node_ports``: explicit (client, controller) ports per node (tests use free
        ports); otherwise the +2 scheme from ``port`` and ``controller_port``.
        ``secure``: the SASL_SSL broker with ACLs (connectors/stack/secure.py), in a
        folder of its own (``kafka-secure``): its users are created when it is formatted."""
        self.paths = paths
        self.dir = paths.kafka_secure if secure else paths.kafka
        self.material: SecureMaterial | None = (
            ensure_material(self.dir / "tls", lambda _: None) if secure else None
        )
        client = self.material.client_properties("admin") if self.material else {}
        self.cluster_file = self.dir / "cluster.json"
        self.requested = brokers
        recorded = self.recorded_brokers()
        count = recorded or brokers or (len(node_ports) if node_ports else 1)
        if not 1 <= count <= MAX_BROKERS:
            raise StackError(f"the broker count must be between 1 and {MAX_BROKERS}, got {count}")
        if node_ports is None:
            node_ports = [(port + 2 * i, controller_port + 2 * i) for i in range(count)]
        if len(node_ports) != count:
            raise StackError(f"{count} brokers need {count} port pairs, got {len(node_ports)}")
        flat = [p for pair in node_ports for p in pair]
        if len(set(flat)) != len(flat):
            raise StackError(
                f"the Kafka ports overlap ({', '.join(map(str, flat))}): node i listens on "
                "CRONLOG_STACK_KAFKA_PORT + 2i and CRONLOG_STACK_CONTROLLER_PORT + 2i, so "
                "give the two ports different parities (e.g. 9092 and 9093)"
            )
        if count == 1:  # the historical one-broker layout, kept for existing state folders
            self.nodes = [KafkaNode(1, self.dir, *node_ports[0], client, host)]
        else:
            self.nodes = [
                KafkaNode(i + 1, self.dir / f"node-{i + 1}", *ports, client, host)
                for i, ports in enumerate(node_ports)
            ]
        self.replication, self.min_isr = replication_for(count)

    @property
    def brokers(self) -> int:
        return len(self.nodes)

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def controller_port(self) -> int:
        return self.nodes[0].controller_port

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    # -- state -------------------------------------------------------------------------
    def recorded_brokers(self) -> int | None:
        """How many brokers this state folder's cluster was formatted with (None: new)."""
        if self.cluster_file.exists():
            return int(json.loads(self.cluster_file.read_text())["brokers"])
        if (self.dir / "data" / "meta.properties").exists():
            return 1  # formatted before cluster.json existed: the one-broker layout
        return None

    def check_count(self) -> None:
        recorded = self.recorded_brokers()
        if self.requested is not None and recorded is not None and recorded != self.requested:
            raise StackError(
                f"the state folder {self.paths.state} holds a {recorded}-broker Kafka "
                f"cluster; it cannot become a {self.requested}-broker one (topics, "
                "replicas and the controller quorum are fixed when it is formatted). Use "
                f"--brokers {recorded}, another CRONLOG_STATE_DIR, or stop it and remove "
                f"{self.dir} (losing its topics)."
            )

    def status(self) -> KafkaStatus:
        nodes = tuple(
            NodeStatus(
                node.node_id,
                node.bootstrap,
                pid := node.pid(),
                pid is not None and node.answers(1.0, 1),
            )
            for node in self.nodes
        )
        return KafkaStatus(all(n.running for n in nodes), self.bootstrap, nodes[0].pid, nodes)

    # -- up ----------------------------------------------------------------------------
    def up(self, log: Log = print) -> KafkaStatus:
        """Start every node that is not running (all of them, or one a test killed) and
        wait until each serves metadata listing the whole cluster."""
        self.check_count()
        stopped = [node for node in self.nodes if node.pid() is None]
        if stopped:
            self.check_ports()
            java = _check_java()
            libs = self._ensure_jars(log)
            cluster_id = self._cluster_id()
            for node in stopped:
                self._render_config(node)
            # Together: each is a JVM's start (seconds), and a cluster has three.
            with ThreadPoolExecutor(len(stopped)) as pool:
                formats = [
                    pool.submit(self._format_storage, node, java, libs, cluster_id, log)
                    for node in stopped
                ]
            for done in formats:
                done.result()  # its StackError, if it failed
            # Start them all before waiting: a node of a 3-voter quorum is not ready
            # until a majority of the voters runs.
            procs = [(node, self._launch(node, java, libs, log)) for node in stopped]
        else:
            procs = []

        def ready() -> bool:
            for node, proc in procs:
                if proc.poll() is not None:
                    raise StackError(
                        f"Kafka node {node.node_id} exited with code {proc.returncode} during "
                        f"start-up; see {node.dir / 'kafka.out'} and {node.logs / 'server.log'}"
                    )
            return all(node.answers(2.0, self.brokers) for node in self.nodes)

        wait_until(ready, 180, f"Kafka on {self.bootstrap}")
        return self.status()

    def start_node(self, node_id: int, log: Log = print) -> KafkaStatus:
        """Start one node (tests restart a killed broker); the others must be formatted."""
        node = self.node(node_id)
        if node.pid() is None:
            return self.up(log)  # starts exactly the stopped nodes
        return self.status()

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise StackError(f"no Kafka node {node_id} (the cluster has {self.brokers})")

    def _launch(self, node: KafkaNode, java: str, libs: Path, log: Log) -> subprocess.Popen[bytes]:
        log(f"starting Kafka node {node.node_id} on {node.bootstrap} (logs: {node.logs})")
        node.logs.mkdir(parents=True, exist_ok=True)
        heap = SINGLE_HEAP if self.brokers == 1 else CLUSTER_HEAP
        with open(node.dir / "kafka.out", "ab") as out:
            proc = subprocess.Popen(
                [
                    java,
                    *heap,
                    *JVM_OPTS,
                    f"-Dkafka.logs.dir={node.logs}",
                    f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                    "-cp",
                    f"{libs}/*",
                    "kafka.Kafka",
                    str(node.config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives `cronlog stack up`
            )
        node.pid_file.write_text(f"{proc.pid}\n")
        return proc

    def check_ports(self) -> None:
        """Refuse to start when another process holds our ports (ours may hold them)."""
        for node in self.nodes:
            if node.pid() is not None:
                continue
            for host, port in ((node.host, node.port), ("127.0.0.1", node.controller_port)):
                if port_open(port, host):
                    raise StackError(
                        f"port {port} is taken by another process, so the local Kafka cannot "
                        "start. Stop that process (another cronlog checkout: `cronlog stack "
                        "down` there), or point cronlog at an existing broker with "
                        "CRONLOG_KAFKA."
                    )

    def _ensure_jars(self, log: Log) -> Path:
        pom = KAFKA_ASSETS / "pom.xml"
        stamp = self.paths.kafka_libs / ".complete"
        digest = hashlib.sha256(pom.read_bytes()).hexdigest()
        if stamp.exists() and stamp.read_text().strip() == digest:
            return self.paths.kafka_libs
        mvn = shutil.which("mvn")
        if mvn is None:
            raise StackError(
                "Maven (mvn) is needed to fetch the Kafka jars from Maven Central: "
                "apt-get install maven"
            )
        log("fetching the Kafka jars from Maven Central with mvn (first run only)")
        if self.paths.kafka_libs.exists():
            shutil.rmtree(self.paths.kafka_libs)
        self.paths.kafka_libs.mkdir(parents=True)
        run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={self.paths.kafka_libs}",
                "-DincludeScope=runtime",
            ],
            "mvn dependency:copy-dependencies",
            timeout_s=900,
        )
        if not any(self.paths.kafka_libs.glob("kafka_2.13-*.jar")):
            raise StackError(f"mvn finished but no kafka_2.13 jar is in {self.paths.kafka_libs}")
        stamp.write_text(digest + "\n")
        return self.paths.kafka_libs

    def _cluster_id(self) -> str | None:
        """The one cluster id every node is formatted with, chosen once and recorded
        (None for a one-broker folder formatted before the record existed)."""
        if self.cluster_file.exists():
            return str(json.loads(self.cluster_file.read_text())["cluster_id"])
        if self.recorded_brokers() is not None:
            return None
        # A cluster id is a base64url UUID without padding (what `random-uuid` prints).
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cluster_file.write_text(
            json.dumps({"brokers": self.brokers, "cluster_id": cluster_id}) + "\n"
        )
        return cluster_id

    def _render_config(self, node: KafkaNode) -> None:
        node.dir.mkdir(parents=True, exist_ok=True)
        template = Template((KAFKA_ASSETS / "server.properties.in").read_text())
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        if self.material is not None:
            listeners = listener_config(self.material, node.port, node.controller_port)
        else:
            listeners = "\n".join(
                [
                    f"listeners=PLAINTEXT://{node.host}:{node.port},"
                    f"CONTROLLER://127.0.0.1:{node.controller_port}",
                    f"advertised.listeners=PLAINTEXT://{node.host}:{node.port}",
                    "controller.listener.names=CONTROLLER",
                    "inter.broker.listener.name=PLAINTEXT",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                ]
            )
        write_private(  # a secured node's holds passwords: 0600 from its creation
            node.config,
            template.substitute(
                listener_config=listeners,
                node_id=node.node_id,
                voters=voters,
                port=node.port,
                controller_port=node.controller_port,
                log_dirs=node.dir / "data",
                replication=self.replication,
                min_isr=self.min_isr,
            ),
        )

    def _format_storage(
        self, node: KafkaNode, java: str, libs: Path, cluster_id: str | None, log: Log
    ) -> None:
        if node.formatted():
            return
        if cluster_id is None:
            raise StackError(f"{node.dir} is not formatted but its cluster id is unknown")
        log(f"formatting Kafka storage of node {node.node_id} (cluster {cluster_id})")
        run(
            [
                java,
                "-Xmx256m",
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                f"-Dkafka.logs.dir={node.logs}",
                "-cp",
                f"{libs}/*",
                "kafka.tools.StorageTool",
                "format",
                # One argument: a base64url id may begin with "-", which a separate
                # argument would have parsed as an option (1 start in 64 failed).
                f"--cluster-id={cluster_id}",
                "-c",
                str(node.config),
                *(scram_format_args(self.material) if self.material else []),
            ],
            "formatting Kafka storage",
            timeout_s=120,
        )

    # -- down --------------------------------------------------------------------------
    def down(self) -> bool:
        """Stop every node cleanly (controlled shutdown). Returns True if one ran.

        SIGTERM goes to all nodes at once: stopped one by one, the last nodes of a
        quorum would wait for a controller majority that is already gone."""
        running = [(node, pid) for node in self.nodes if (pid := node.pid()) is not None]
        for node in self.nodes:
            if node.pid() is None:
                node.pid_file.unlink(missing_ok=True)
        if not running:
            return False
        killed = _stop_all([pid for _, pid in running], grace_s=60)
        for node, _ in running:
            node.pid_file.unlink(missing_ok=True)
        if killed:
            raise StackError(
                f"Kafka (pid {', '.join(map(str, killed))}) did not stop within 60 s and was killed"
            )
        return True


def _stop_all(pids: list[int], grace_s: float) -> list[int]:
    """SIGTERM every pid together; those still alive after grace_s are killed."""
    killed: list[int] = []

    def stop(pid: int) -> None:
        if stop_pid(pid, grace_s):
            killed.append(pid)

    threads = [threading.Thread(target=stop, args=(pid,)) for pid in pids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return killed


@functools.cache
def _check_java() -> str:
    """The java that runs Kafka, checked once a process (a cluster's restarts ask again)."""
    java = shutil.which("java")
    if java is None:
        raise StackError(
            f"Java {MIN_JAVA}+ is needed to run Kafka 4: apt-get install openjdk-17-jre-headless"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)', out.stderr + out.stdout)
    if match is None or int(match.group(1)) < MIN_JAVA:
        found = match.group(1) if match else "unknown"
        raise StackError(f"Kafka 4 needs Java {MIN_JAVA}+, found Java {found} at {java}")
    return java
