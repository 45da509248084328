"""A real Apache Kafka 4.x broker in KRaft mode, run from Maven Central jars on local Java.

The jars come from ``compose/kafka/pom.xml`` via ``mvn dependency:copy-dependencies``
(cached in ~/.m2, so later runs are offline-fast). Storage is formatted once; the log
dirs live under the state folder and survive ``down``/``up``.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from string import Template

from confluent_kafka.admin import AdminClient

from connectors.stack.paths import COMPOSE_DIR, StackPaths
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

PORT = 9092
CONTROLLER_PORT = 9093
JVM_OPTS = ("-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-Djava.awt.headless=true")
MIN_JAVA = 17
LOG4J_CONFIG = COMPOSE_DIR / "kafka" / "log4j2.properties"


@dataclass(frozen=True, slots=True)
class KafkaStatus:
    running: bool
    bootstrap: str
    pid: int | None


class KafkaStack:
    def __init__(self, paths: StackPaths, port: int = PORT, controller_port: int = CONTROLLER_PORT):
        self.paths = paths
        self.port = port
        self.controller_port = controller_port
        self.dir = paths.kafka
        self.config = self.dir / "server.properties"
        self.pid_file = self.dir / "kafka.pid"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    # -- state -------------------------------------------------------------------------
    def _our_pid(self) -> int | None:
        """The pid of the broker this state folder started, if it still runs."""
        pid = read_pid(self.pid_file)
        if pid and pid_alive(pid) and str(self.config) in cmdline(pid):
            return pid
        return None

    def status(self) -> KafkaStatus:
        pid = self._our_pid()
        return KafkaStatus(pid is not None and self._answers(1.0), self.bootstrap, pid)

    def _answers(self, timeout_s: float) -> bool:
        if not port_open(self.port):
            return False
        try:
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000})
            metadata = admin.list_topics(timeout=timeout_s)
        except Exception:  # noqa: BLE001 - any failure means "not ready yet"
            return False
        return bool(metadata.brokers)

    # -- up ----------------------------------------------------------------------------
    def up(self, log: Log = print) -> KafkaStatus:
        if self._our_pid() is not None:
            wait_until(lambda: self._answers(2.0), 60, f"Kafka on {self.bootstrap}")
            return self.status()
        self.check_ports()
        java = _check_java()
        libs = self._ensure_jars(log)
        self._render_config()
        self._format_storage(java, libs, log)
        log(f"starting Kafka on {self.bootstrap} (logs: {self.dir / 'logs'})")
        logs = self.dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(self.dir / "kafka.out", "ab") as out:
            proc = subprocess.Popen(
                [
                    java,
                    *JVM_OPTS,
                    f"-Dkafka.logs.dir={logs}",
                    f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                    "-cp",
                    f"{libs}/*",
                    "kafka.Kafka",
                    str(self.config),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # outlives `cronlog stack up`
            )
        self.pid_file.write_text(f"{proc.pid}\n")

        def ready() -> bool:
            if proc.poll() is not None:
                raise StackError(
                    f"Kafka exited with code {proc.returncode} during start-up; see "
                    f"{self.dir / 'kafka.out'} and {logs / 'server.log'}"
                )
            return self._answers(2.0)

        wait_until(ready, 120, f"Kafka on {self.bootstrap}")
        return self.status()

    def check_ports(self) -> None:
        """Refuse to start when another process holds our ports (ours may hold them)."""
        if self._our_pid() is not None:
            return
        for port in (self.port, self.controller_port):
            if port_open(port):
                raise StackError(
                    f"port {port} is taken by another process, so the local Kafka cannot "
                    "start. Stop that process (another cronlog checkout: `cronlog stack "
                    "down` there), or point cronlog at an existing broker with CRONLOG_KAFKA."
                )

    def _ensure_jars(self, log: Log) -> Path:
        pom = COMPOSE_DIR / "kafka" / "pom.xml"
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

    def _render_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        template = Template((COMPOSE_DIR / "kafka" / "server.properties.in").read_text())
        self.config.write_text(
            template.substitute(
                port=self.port,
                controller_port=self.controller_port,
                log_dirs=self.dir / "data",
            )
        )

    def _format_storage(self, java: str, libs: Path, log: Log) -> None:
        if (self.dir / "data" / "meta.properties").exists():
            return
        # A cluster id is a base64url UUID without padding (what `random-uuid` prints).
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        log(f"formatting Kafka storage (cluster {cluster_id})")
        run(
            [
                java,
                "-Xmx256m",
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                f"-Dkafka.logs.dir={self.dir / 'logs'}",
                "-cp",
                f"{libs}/*",
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(self.config),
            ],
            "formatting Kafka storage",
            timeout_s=120,
        )

    # -- down --------------------------------------------------------------------------
    def down(self) -> bool:
        """Stop the broker cleanly (controlled shutdown). Returns True if one ran."""
        pid = self._our_pid()
        if pid is None:
            self.pid_file.unlink(missing_ok=True)
            return False
        if stop_pid(pid, grace_s=60):
            raise StackError(f"Kafka (pid {pid}) did not stop within 60 s and was killed")
        self.pid_file.unlink(missing_ok=True)
        return True


def _check_java() -> str:
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
