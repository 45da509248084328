"""Chaos: random faults on a replicated cluster under load, then the checks.

A private three-broker Kafka cluster (tests/support/cluster.py; topics with 3 replicas,
min ISR 2), a private database on the shared PostgreSQL, two nodes, three
workers and the projector; jobs `every 1s` (idempotent, retried). For the duration,
one random fault at a time, each undone before the next:

- kill -9 a broker (the busiest leader half the time), restarted 5-20 s later;
- kill -9 a node, restarted;
- kill -9 a node's ledger process (the node exits with it; restarted like a supervisor);
- kill -9 a worker or the projector, restarted;
- SIGSTOP a worker for 5-15 s, then SIGCONT.

PostgreSQL is not restarted: this benchmark uses the shared one, which serves every
other test and helper (restarting it is only safe on a private PostgreSQL).

At the end every job is paused, every run must become final, and the checks run: no
duplicate run, no missed firing, no acknowledged command lost, every run final, the
audit of run-events clean. Prints the firings checked, the violations and the start
lateness after each fault. `python -m bench.chaos --duration-s 600` (`make chaos`);
`--quick`: 2 minutes.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from bench.common import _children, audit, report, verdict
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.cluster import PrivateCluster, private_cluster
from tests.support.firings import check_firings, settled, start_lateness
from tests.support.isolation import create_database, drop_database
from tests.support.nodes import (
    CronlogProcess,
    EventReader,
    Node,
    ProjectorProc,
    WorkerProc,
    env_for,
    job,
    send_commands,
)
from tests.support.services import real_services

FAULTS = ("broker", "node", "ledger", "worker", "projector", "sigstop")


class Chaos:
    def __init__(self, cluster: PrivateCluster, settings: Settings, logs: Path, seed: int):
        self.cluster = cluster
        self.settings = settings
        self.rng = random.Random(seed)
        self.nodes = [Node(settings, f"chaos-n{i}", logs) for i in (1, 2)]
        self.workers = [WorkerProc(settings, f"chaos-w{i}", logs, cpu=8) for i in (1, 2, 3)]
        self.projector = ProjectorProc(settings, logs / "chaos-projector.log")
        self.faults: list[tuple[str, int]] = []
        self.kinds: Counter[str] = Counter()
        self.died: Counter[str] = Counter()  # processes found dead and restarted

    @property
    def processes(self) -> list[CronlogProcess]:
        return [*self.nodes, *self.workers, self.projector]

    def start(self) -> None:
        for proc in self.processes:
            proc.start()

    def stop(self) -> None:
        for proc in self.processes:
            proc.stop()

    def supervise(self) -> None:
        """Restart whatever died (what `cronlog run` or systemd would do)."""
        for proc in self.processes:
            if not proc.alive:
                self.died[proc.name] += 1
                proc.start()

    def inject(self, kind: str, wait: Callable[[float], None]) -> str:
        rng = self.rng
        if kind == "broker":
            prefix = self.settings.topic_prefix
            broker = (
                self.cluster.busiest_leader(prefix)
                if rng.random() < 0.5
                else rng.choice(self.cluster.node_ids)
            )
            what = f"kill -9 broker {broker}"
            self._mark(kind, what)
            self.cluster.kill(broker)
            wait(rng.uniform(5, 20))
            self.cluster.start(broker)
            self.cluster.wait_in_sync(prefix, timeout_s=300)
            return what
        if kind == "sigstop":
            worker = rng.choice(self.workers)
            pause_s = rng.uniform(5, 15)
            what = f"SIGSTOP {worker.name} {pause_s:.0f} s"
            self._mark(kind, what)
            worker.signal(signal.SIGSTOP)
            wait(pause_s)
            worker.signal(signal.SIGCONT)
            return what
        if kind == "ledger":
            node = rng.choice(self.nodes)
            assert node.proc is not None
            ledgers = [pid for pid in _children(node.proc.pid) if "spawn_main" in _cmdline(pid)]
            if not ledgers:
                return f"no ledger process found under {node.name}"
            what = f"kill -9 ledger of {node.name}"
            self._mark(kind, what)
            os.kill(ledgers[0], signal.SIGKILL)
            wait(rng.uniform(3, 8))
            return what
        choices: dict[str, list[CronlogProcess]] = {
            "node": list(self.nodes),
            "worker": list(self.workers),
            "projector": [self.projector],
        }
        victim = rng.choice(choices[kind])
        what = f"kill -9 {victim.name}"
        self._mark(kind, what)
        if victim.alive:
            victim.kill()
        wait(rng.uniform(3, 10))
        if not victim.alive:
            victim.start()
        return what

    def _mark(self, kind: str, what: str) -> None:
        self.kinds[kind] += 1
        self.faults.append((what, int(time.time() * 1000)))
        print(f"{time.strftime('%H:%M:%S')} {what}", flush=True)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _migrate(settings: Settings) -> None:
    subprocess.run(
        [sys.executable, "-m", "connectors.cli", "db", "migrate"],
        env=env_for(settings),
        check=True,
        capture_output=True,
        timeout=120,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="2 minutes")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args()
    duration_s = 120.0 if args.quick else args.duration_s
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    ids = [f"chaos-{i:03d}" for i in range(args.jobs)]
    name = f"chaos_{uuid.uuid4().hex[:6]}"
    print(f"chaos: {duration_s:.0f} s, {args.jobs} jobs every 1 s, seed {seed}", flush=True)
    with (
        real_services() as services,
        tempfile.TemporaryDirectory() as tmp,
        private_cluster(Path(tmp)) as cluster,
    ):
        database_url, kind = create_database(services.database_url, name)
        settings = Settings(
            kafka=cluster.bootstrap,
            database_url=database_url,
            topic_prefix=f"{name}.",
            partitions=6,
        )
        logs = args.logs or Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        try:
            ensure_topics(settings)
            _migrate(settings)
            figures = _run(settings, cluster, logs, ids, duration_s, seed)
        finally:
            drop_database(services.database_url, name, kind)
    report("chaos", figures)
    if figures["violations"] != 0 or figures["audit"] != "clean":
        raise SystemExit(1)


def _run(
    settings: Settings,
    cluster: PrivateCluster,
    logs: Path,
    ids: list[str],
    duration_s: float,
    seed: int,
) -> dict[str, object]:
    chaos = Chaos(cluster, settings, logs, seed)
    events = EventReader(settings, "chaos-check")
    manual: list[str] = []
    chaos.start()
    try:
        send_commands(
            settings,
            [
                job(
                    j,
                    ["true"],
                    schedule={"every": "1s"},
                    idempotent=True,
                    retry={"max_attempts": 5, "backoff_s": 0},
                )
                for j in ids
            ],
        )
        events.wait_until(
            lambda: (
                {e.job_id for e, _ in events.run_events() if e.state == "succeeded"} >= set(ids)
            ),
            300,
            "every job's first run",
        )
        started = time.monotonic()

        def wait(seconds: float) -> None:
            chaos.supervise()
            events.poll_for(seconds)

        n = 0
        while time.monotonic() - started < duration_s:
            wait(chaos.rng.uniform(5, 15))
            kind = chaos.rng.choice(FAULTS)
            # Not `wait`: the fault decides when its victim comes back (a supervisor
            # restarting it meanwhile would make two processes with one id).
            chaos.inject(kind, events.poll_for)
            # An acknowledged command in the wake of each fault must not be lost.
            n += 1
            request = f"c{n}"
            target = chaos.rng.choice(ids)
            send_commands(
                settings, [{"type": "job.run_now", "job_id": target, "request_id": request}]
            )
            manual.append(f"{target}@manual:{request}")
            wait(chaos.rng.uniform(3, 8))
        wait(10)
        chaos.supervise()
        send_commands(settings, [{"type": "job.pause", "job_id": j} for j in ids])
        events.wait_until(
            lambda: {e.job_id for e in events.job_events() if e.kind == "paused"} >= set(ids),
            300,
            "every job paused",
        )
        try:
            events.wait_until(lambda: settled(events), 300, "every run final")
        except AssertionError as exc:
            print(f"warning: {exc}", flush=True)
        events.poll_for(3)
    finally:
        events.close()
        chaos.stop()

    check = check_firings(events, ids, 1000, manual, require_success=False)
    code, audit_text = audit(settings)
    if code != 0:
        print(audit_text)
    rows = []
    ends = [at for _, at in chaos.faults[1:]] + [
        chaos.faults[-1][1] + 60_000 if chaos.faults else 0
    ]
    for (what, at_ms), next_ms in zip(chaos.faults, ends, strict=False):
        late = start_lateness(events, at_ms - 2000, min(next_ms, at_ms + 30_000))
        rows.append(f"{what}: {late}")
        print(f"  {what}: {late}")
    if chaos.faults:  # the baseline: the 10 s before the first fault
        first = chaos.faults[0][1]
        print(f"  before any fault: {start_lateness(events, first - 12_000, first - 2000)}")
    summary = check.summary()
    print("examples:", summary.pop("examples"))
    return {
        "duration_s": duration_s,
        "seed": seed,
        "jobs": len(ids),
        "faults": len(chaos.faults),
        "faults_by_kind": dict(chaos.kinds),
        "restarted_after_dying": dict(chaos.died),
        **summary,
        "manual_runs_checked": len(manual),
        "violations": check.violations,
        "audit": verdict(code),
        "lateness_per_fault": rows,
    }


if __name__ == "__main__":
    main()
