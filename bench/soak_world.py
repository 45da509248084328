"""The soak's world (bench/soak.py) and its nemesis.

The world: a private three-broker cluster serving clients on the root end of a veth
pair (tests/support/netns.py), a private PostgreSQL (connectors/stack/postgres.py's
PostgresStack on a port and folder of its own, so it can be killed), two nodes (n2 in a
network namespace of its own; n1's wall clock under libfaketime, read from a file, so
it can be stepped while it runs), three process workers (w3 in a namespace of its own),
one HTTP worker (bench/soak_http.py), the projector, the API and the notifier, all with
default options. A supervisor restarts whatever died outside a fault, as systemd would.

The nemesis: one fault at a time, each undone before the next, logged with its start
and end (ms). A kind the machine cannot stage is left out and named in `unavailable`.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.common import _children
from bench.soak_prices import Fault
from connectors.stack.paths import StackPaths
from connectors.stack.postgres import PostgresStack
from streams.settings import Settings
from tests.support.cluster import PrivateCluster
from tests.support.netns import Direction, Namespace
from tests.support.nodes import CronlogProcess, Node, ProjectorProc, WorkerProc
from tests.support.ports import free_port
from tests.support.waiting import eventually

API_TOKEN = "tok-soak-0123456789ab"  # owner `soak`: the people on the API
ADMIN_TOKEN = "tok-soak-admin-0123456789ab"
HTTP_TOKEN = "tok-soak-http-0123456789ab"

# Faults that may kill a running job on the worker they hit (the worker's lease lost):
# the docs promise every other fault is survived by a running job.
FATAL = frozenset({"worker", "worker_lost", "partition_worker", "latency_worker"})


def private_postgres(state: Path) -> PostgresStack:
    """A PostgreSQL of the soak's own, on a free port: the stack's own start-up."""
    stack = PostgresStack(StackPaths(state), port=free_port())
    stack.up(log=lambda _: None)
    return stack


def postmaster_pid(stack: PostgresStack) -> int | None:
    try:
        return int((stack.data / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


def drop_postgres(stack: PostgresStack) -> None:
    pid = postmaster_pid(stack)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(stack.base, ignore_errors=True)


class HttpWorkerProc(CronlogProcess):
    """bench/soak_http.py as a process the supervisor and nemesis treat like any other."""

    def __init__(self, settings: Settings, worker_id: str, logdir: Path, api_url: str):
        super().__init__(settings, worker_id, logdir, [])
        journal = str(logdir / f"{worker_id}.journal")
        self.argv = [
            sys.executable, "-m", "bench.soak_http", api_url, worker_id, HTTP_TOKEN, "2", journal
        ]  # fmt: skip


class World:
    def __init__(
        self,
        settings: Settings,
        cluster: PrivateCluster,
        postgres: PostgresStack,
        ns_worker: Namespace,
        ns_node: Namespace,
        logs: Path,
        clock_file: Path,
        skew: dict[str, str] | None,
    ):
        self.settings = settings
        self.cluster = cluster
        self.postgres = postgres
        self.ns_worker = ns_worker
        self.ns_node = ns_node
        self.logs = logs
        self.clock_file = clock_file
        self.skewed = skew is not None
        n1_env = None
        if skew is not None:
            clock_file.write_text("+0\n")
            n1_env = {**skew, "FAKETIME_TIMESTAMP_FILE": str(clock_file)}
            n1_env["FAKETIME_CACHE_DURATION"] = "1"
        self.nodes = [
            Node(settings, "n1", logs, extra_env=n1_env),
            Node(settings, "n2", logs, prefix=ns_node.prefix),
        ]
        self.api_port = free_port()
        self.api_url = f"http://{ns_worker.host_ip}:{self.api_port}"
        self.workers: list[CronlogProcess] = [
            self.native_worker("w1"),
            self.native_worker("w2"),
            self.native_worker("w3", ns_worker.prefix),
            HttpWorkerProc(settings, "h1", logs, self.api_url),
        ]
        self.projector = ProjectorProc(settings, logs / "projector.log")
        tokens = {
            "CRONLOG_API_TOKENS": f"{API_TOKEN}=soak",
            "CRONLOG_API_ADMIN_TOKENS": ADMIN_TOKEN,
            "CRONLOG_WORKER_TOKENS": f"{HTTP_TOKEN}=h1",
        }
        # On the veth's root end: the HTTP worker may be anywhere the brokers are.
        self.api = CronlogProcess(
            settings,
            "api",
            logs,
            ["api", "--host", ns_worker.host_ip, "--port", str(self.api_port)],
            extra_env=tokens,
        )
        self.notifier = CronlogProcess(settings, "notifier", logs, ["notifier"])
        self.replaced = 0

    def native_worker(self, worker_id: str, prefix: tuple[str, ...] = ()) -> WorkerProc:
        # Default options but the capacity (room for the load) and a label the long jobs
        # ask for, so they run on process workers only.
        return WorkerProc(
            self.settings,
            worker_id,
            self.logs,
            cpu=8,
            memory_mb=4096,
            labels=("kind=native",),
            prefix=prefix,
        )

    @property
    def processes(self) -> list[CronlogProcess]:
        return [*self.nodes, *self.workers, self.projector, self.api, self.notifier]

    def start(self) -> None:
        for proc in self.processes:
            proc.start()
        self.wait_api()

    def wait_api(self, timeout_s: float = 120) -> None:
        def ready() -> bool:
            try:
                return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(ready, "the API to be ready", timeout_s)

    def supervise(self) -> list[str]:
        """Restart whatever died (what `cronlog run` or systemd does); their names."""
        died = []
        for proc in self.processes:
            if not proc.alive:
                died.append(proc.name)
                proc.start()
        return died

    def stop(self) -> None:
        for proc in self.processes:
            proc.ask_stop()
        for proc in self.processes:
            proc.await_stop()


Wait = Callable[[float], None]


class Nemesis:
    """One fault at a time, chosen at random among the kinds this machine can stage."""

    def __init__(self, world: World, rng: random.Random, quick: bool):
        self.world = world
        self.rng = rng
        self.quick = quick
        self.faults: list[Fault] = []
        self.current = "none"
        self.unavailable: dict[str, str] = {}
        if shutil.which("nft") is None:
            for kind in ("partition_worker", "partition_node", "latency_worker"):
                self.unavailable[kind] = "nftables (`nft`) is not installed"
        if not world.skewed:
            self.unavailable["clock"] = "libfaketime or a C compiler is missing"
        self.kinds = [
            k
            for k in (
                "node",
                "ledger",
                "worker",
                "projector",
                "api",
                "broker",
                "broker_sigstop",
                "postgres",
                "partition_worker",
                "partition_node",
                "latency_worker",
                "clock",
            )
            if k not in self.unavailable
        ]

    def inject(self, kind: str, wait: Wait) -> None:
        getattr(self, f"_{kind}")(wait)

    def _fault(self, kind: str, what: str, target: str, act: Callable[[], object]) -> int:
        self.current = what
        print(f"{time.strftime('%H:%M:%S')} fault: {what}", flush=True)
        started = int(time.time() * 1000)
        act()
        return started

    def _end(self, kind: str, what: str, target: str, started: int) -> None:
        self.faults.append(Fault(kind, what, target, started, int(time.time() * 1000)))
        self.current = "none"

    def _kill_restart(self, kind: str, proc: CronlogProcess, wait: Wait) -> None:
        what = f"kill -9 {proc.name}"
        started = self._fault(kind, what, proc.name, lambda: proc.kill() if proc.alive else None)
        wait(self.rng.uniform(3, 10))
        if not proc.alive:
            proc.start()
        self._end(kind, what, proc.name, started)

    def _node(self, wait: Wait) -> None:
        self._kill_restart("node", self.rng.choice(self.world.nodes), wait)

    def _worker(self, wait: Wait) -> None:
        self._kill_restart("worker", self.rng.choice(self.world.workers), wait)

    def _projector(self, wait: Wait) -> None:
        self._kill_restart("projector", self.world.projector, wait)

    def _api(self, wait: Wait) -> None:
        self._kill_restart("api", self.world.api, wait)

    def _ledger(self, wait: Wait) -> None:
        node = self.rng.choice(self.world.nodes)
        assert node.proc is not None
        ledgers = [p for p in _children(node.proc.pid) if "spawn_main" in _cmdline(p)]
        if not ledgers:
            return
        what = f"kill -9 ledger of {node.name}"
        started = self._fault(
            "ledger", what, node.name, lambda: os.kill(ledgers[0], signal.SIGKILL)
        )
        wait(self.rng.uniform(3, 8))
        if not node.alive:  # the node exits with its ledger: restarted like a supervisor
            node.start()
        self._end("ledger", what, node.name, started)

    def worker_lost(self, wait: Wait) -> None:
        """A worker lost for good (its machine gone), replaced by a new one with a new id
        in the same place (so the namespaced one stays the namespaced one)."""
        world = self.world
        natives = [w for w in world.workers if isinstance(w, WorkerProc)]
        victim = self.rng.choice(natives)
        world.replaced += 1
        new_id = f"{victim.name}r{world.replaced}"
        what = f"{victim.name} lost for good, replaced by {new_id}"
        started = self._fault("worker_lost", what, victim.name, victim.kill)
        prefix = world.ns_worker.prefix if victim.argv[0] == "ip" else ()
        fresh = world.native_worker(new_id, prefix)
        world.workers[world.workers.index(victim)] = fresh
        wait(self.rng.uniform(5, 15))
        fresh.start()
        self._end("worker_lost", what, victim.name, started)

    def _broker(self, wait: Wait) -> None:
        cluster, prefix = self.world.cluster, self.world.settings.topic_prefix
        busiest = self.rng.random() < 0.5
        broker = cluster.busiest_leader(prefix) if busiest else self.rng.choice(cluster.node_ids)
        what = f"kill -9 broker {broker}" + (" (busiest leader)" if busiest else "")
        started = self._fault("broker", what, f"broker{broker}", lambda: cluster.kill(broker))
        wait(self.rng.uniform(5, 20))
        cluster.start(broker)
        self._until(lambda: not cluster.under_replicated(prefix), 300, wait)
        self._end("broker", what, f"broker{broker}", started)

    def _broker_sigstop(self, wait: Wait) -> None:
        cluster = self.world.cluster
        broker = self.rng.choice(cluster.node_ids)
        pid = cluster.pid(broker)
        if pid is None:
            return
        pause_s = self.rng.uniform(10, 30)
        what = f"SIGSTOP broker {broker} {pause_s:.0f} s"
        started = self._fault(
            "broker_sigstop", what, f"broker{broker}", lambda: os.kill(pid, signal.SIGSTOP)
        )
        try:
            wait(pause_s)
        finally:
            os.kill(pid, signal.SIGCONT)
        self._until(
            lambda: not cluster.under_replicated(self.world.settings.topic_prefix), 300, wait
        )
        self._end("broker_sigstop", what, f"broker{broker}", started)

    def _postgres(self, wait: Wait) -> None:
        stack = self.world.postgres
        pid = postmaster_pid(stack)
        if pid is None:
            return
        what = "kill -9 PostgreSQL's postmaster"
        started = self._fault("postgres", what, "postgres", lambda: os.kill(pid, signal.SIGKILL))
        wait(self.rng.uniform(3, 10))
        self._until(lambda: not _alive(pid), 30, wait)
        stack.up(log=lambda _: None)
        self._end("postgres", what, "postgres", started)

    def _partition(self, kind: str, ns: Namespace, target: str, wait: Wait) -> None:
        direction: Direction = self.rng.choice(("both", "in", "out"))
        cut_s = self.rng.uniform(5, 40)
        what = f"{target} cut off ({direction}) {cut_s:.0f} s"
        started = self._fault(kind, what, target, lambda: ns.drop(direction))
        try:
            wait(cut_s)
        finally:
            ns.undrop()
        self._end(kind, what, target, started)

    def _partition_worker(self, wait: Wait) -> None:
        self._partition("partition_worker", self.world.ns_worker, self._ns_worker_id(), wait)

    def _partition_node(self, wait: Wait) -> None:
        self._partition("partition_node", self.world.ns_node, "n2", wait)

    def _ns_worker_id(self) -> str:
        return next(w.name for w in self.world.workers if w.argv[0] == "ip")

    def _latency_worker(self, wait: Wait) -> None:
        """Added latency with jitter on the namespaced worker's connections to the
        busiest leader (the proxy takes one port; the other brokers stay direct)."""
        cluster, ns = self.world.cluster, self.world.ns_worker
        broker = cluster.busiest_leader(self.world.settings.topic_prefix)
        port = cluster.kafka.node(broker).port
        ms, span_s = self.rng.choice((50, 200, 500)), self.rng.uniform(20, 40)
        target = self._ns_worker_id()
        what = f"{target} +{ms} ms (jitter {ms // 4}) to broker {broker} {span_s:.0f} s"
        started = self._fault("latency_worker", what, target, lambda: ns.delay(port, ms, ms / 4))
        try:
            wait(span_s)
        finally:
            ns.undelay()
        self._end("latency_worker", what, target, started)

    def _clock(self, wait: Wait) -> None:
        step_s = self.rng.choice((-1, 1)) * self.rng.randint(2, 30)
        span_s = self.rng.uniform(20, 60)
        what = f"n1's clock stepped {step_s:+d} s for {span_s:.0f} s"
        file = self.world.clock_file
        started = self._fault("clock", what, "n1", lambda: file.write_text(f"{step_s:+d}\n"))
        try:
            wait(span_s)
        finally:
            file.write_text("+0\n")
        self._end("clock", what, "n1", started)

    def _until(self, check: Callable[[], bool], timeout_s: float, wait: Wait) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if check():
                    return
            except Exception:  # noqa: BLE001 - a broker in mid-start: ask again
                pass
            wait(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def run_quietly(argv: list[str], env: dict[str, str]) -> None:
    subprocess.run(argv, env=env, check=True, capture_output=True, timeout=120)
