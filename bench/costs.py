"""Costs: what one run costs, per process, at a fixed sustained rate (the map for issue 14).

R jobs `every 1s` (R runs/s) on one node, noop workers and a projector. After a warm-up,
for --seconds it measures, from /proc: CPU milliseconds per run started for each process
(the node split by thread: ingress is its main thread, the scheduler and dispatcher loops
name their OS threads, librdkafka's threads are `rdk:*`; the ledger process; each worker;
the projector; the broker; PostgreSQL), the records per run of every topic (end offsets,
transaction markers included), the machine's idle share, and where the ledger's cycle
spends its wall time (py-spy samples of the ledger process, classified by the innermost
frame of ours on the stack).
`python -m bench.costs --rate 250 --seconds 40` (`--quick`: 250 runs/s for 20 s).

Scale-out: `--nodes N` runs N nodes over the same partitions (each owns its
share of job-log and dispatch); node rows are summed over the nodes. Before any job is
registered the bench measures the nodes' idle CPU (`--idle-s`) so that the table can
tell a cost per run from a fixed cost per node (consumers polling).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.common import (
    _children,
    audit,
    bench_settings,
    report,
    step_figures,
    table,
    verdict,
    window_lateness,
)
from connectors.stack import Stack, StackPaths
from streams.kafka import connection_config
from streams.settings import Settings
from tests.support.isolation import create_database, drop_database, unique_name
from tests.support.nodes import EventReader, Node, ProjectorProc, WorkerProc, send_commands

TICK = os.sysconf("SC_CLK_TCK")


def _ticks(stat_path: str) -> int:
    """utime + stime of a process or thread, in clock ticks (0 if it is gone)."""
    try:
        fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def _comm(path: str) -> str:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return ""


def node_threads(pid: int) -> Counter[str]:
    """CPU ticks of the node process by thread group: the loops carry the OS names
    streams/node.py gives them (the main thread only waits for a signal)."""
    ticks: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        comm = _comm(f"{task}/comm")
        if comm in ("ingress", "gate", "scheduler", "dispatcher"):
            group = comm
        elif comm.startswith("rdk:"):
            group = "librdkafka"
        else:
            group = "other"
        ticks[group] += _ticks(f"{task}/stat")
    return ticks


def ledger_pid(node_pid: int) -> int | None:
    """The ledger: the node's multiprocessing child (not its resource tracker)."""
    for child in _children(node_pid):
        cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"spawn_main" in cmdline:
            return child
    return None


def process_ticks(pid: int | None) -> float:
    """CPU seconds of one process (0 if unknown or gone)."""
    return _ticks(f"/proc/{pid}/stat") / TICK if pid else 0.0


def postgres_ticks() -> int:
    total = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _comm(f"{proc}/comm").startswith("postgres"):
            total += _ticks(f"{proc}/stat")
    return total


def machine_ticks() -> tuple[int, int]:
    """(idle + iowait, total) jiffies of all cores, from /proc/stat's `cpu` line."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[3] + values[4], sum(values[:8])  # guest time is already in user


def end_offsets(settings: Settings) -> dict[str, int]:
    """Sum over partitions of the end offset of every topic under the bench's prefix."""
    consumer = Consumer({**connection_config(settings), "group.id": "bench-costs"})
    try:
        topics = consumer.list_topics(timeout=10).topics
        ends: dict[str, int] = {}
        for name, meta in topics.items():
            if name.startswith(settings.topic_prefix):
                ends[name.removeprefix(settings.topic_prefix)] = sum(
                    consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
                    for p in meta.partitions
                )
        return ends
    finally:
        consumer.close()


# Where the ledger's main thread is, by the innermost frame of ours on its stack (checked
# innermost first). Commit wait: `bounded` joins the thread running send_offsets and
# commit_transaction. Poll: `consume` in `run` (idle when nothing is due).
PHASES: list[tuple[str, str, str]] = [
    ("schemas/", "decode", "decode"),
    ("schemas/", "encode", "encode (in produce)"),
    ("schemas/", "", "codec other"),
    ("streams/core/", "", "decide"),
    ("streams/kafka.py", "bounded", "commit wait"),
    ("streams/ledger.py", "_produce", "produce"),
    ("streams/ledger.py", "_apply", "apply"),
    ("streams/ledger.py", "_now_ms", "decide"),
    ("streams/ledger.py", "_process", "decode"),  # JOB_LOG.decode's own frame is C code
    ("streams/ledger.py", "_transact", "transact other"),
    ("streams/ledger.py", "run", "poll/idle"),
]


def classify(stack: list[str]) -> str:
    for frame in reversed(stack):  # py-spy raw: outermost first
        function, _, where = frame.partition(" (")
        for path, name, phase in PHASES:
            if path in where and name in function:
                return phase
    return "other"


def ledger_phases(raw: Path) -> dict[str, float]:
    """Share of the ledger main thread's samples per phase (py-spy --format raw)."""
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if count.isdigit() and any(f.startswith("_ledger_main ") for f in frames):
            counts[classify(frames)] += int(count)
    total = sum(counts.values()) or 1
    return {phase: n / total for phase, n in counts.most_common()}


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=int, default=250)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--warmup-s", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--idle-s", type=float, default=10.0, help="idle baseline window")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rate, args.seconds = 250, 20.0
    broker_pid = Stack(StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))).status().kafka.pid
    with bench_settings("costs") as settings, tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        nodes = [Node(settings, f"cost-node-{i}", logs).start() for i in range(args.nodes)]
        # The projector gets a database of its own: one database serves one deployment.
        db_name = unique_name("bench_costs")
        db_url, db_kind = create_database(settings.database_url, db_name)
        projector = ProjectorProc(
            settings.with_(database_url=db_url), logs / "projector.log"
        ).start()
        workers = [
            WorkerProc(settings, f"cw{i}", logs, cpu=100_000, memory_mb=10**8)
            for i in range(args.workers)
        ]
        for worker in workers:
            worker.argv += ["--executor", "noop"]
            worker.start()
        events = EventReader(settings, "bench-costs")
        spy: subprocess.Popen[bytes] | None = None
        try:
            events.poll_for(args.warmup_s)  # every node up and assigned, nothing to do
            node_pids = [n.proc.pid for n in nodes if n.proc]
            ledgers = {pid: ledger_pid(pid) for pid in node_pids}

            def node_sample() -> Counter[str]:
                ticks: Counter[str] = Counter()
                for pid in node_pids:
                    ticks.update({f"node {k}": v for k, v in node_threads(pid).items()})
                    ledger = ledgers[pid]
                    ticks["ledger"] += _ticks(f"/proc/{ledger}/stat") if ledger else 0
                return ticks

            idle_before = node_sample()
            time.sleep(args.idle_s)
            idle_after = node_sample()
            idle_cores = {
                name: (idle_after[name] - idle_before[name]) / TICK / args.idle_s
                for name in idle_after
            }
            send_commands(
                settings,
                [
                    {
                        "type": "job.upsert",
                        "job_id": f"cost-{i:06d}",
                        "owner": f"o{i % 10}",
                        "schedule": {"every": "1s"},
                        "command": ["true"],
                    }
                    for i in range(args.rate)
                ],
            )
            events.poll_for(args.warmup_s)
            assert projector.proc
            ledger = ledgers[node_pids[0]]  # py-spy samples the first node's ledger
            pids = {
                "projector": projector.proc.pid,
                "broker": broker_pid,
                **{w.name: w.proc.pid for w in workers if w.proc},
            }

            def sample() -> Counter[str]:
                ticks = node_sample()
                for name, pid in pids.items():
                    ticks[name] = _ticks(f"/proc/{pid}/stat") if pid else 0
                ticks["postgres"] = postgres_ticks()
                return ticks

            raw = logs / "ledger.raw"
            tool = py_spy()
            if tool and ledger:
                spy = subprocess.Popen(
                    [
                        *(tool, "record", "--idle", "--nonblocking", "--format", "raw"),
                        *("-d", str(int(args.seconds)), "-p", str(ledger), "-o", str(raw)),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            before, free_before, offsets_before = sample(), machine_ticks(), end_offsets(settings)
            window_start_ms = int(time.time() * 1000)
            events.poll_for(args.seconds)
            window_end_ms = int(time.time() * 1000)
            after, free_after, offsets_after = sample(), machine_ticks(), end_offsets(settings)
            # A process that died in the window would show 0 ms per run: say so.
            dead = [p.name for p in [*nodes, projector, *workers] if not p.alive]
            for name in dead:
                print(f"{name} exited:", (logs / f"{name}.log").read_text()[-2000:])
            spy_note = "py-spy not installed"
            if spy is not None:
                _, err = spy.communicate(timeout=60)
                spy_note = "ok" if spy.returncode == 0 else err.decode()[-300:].strip()
            events.poll_for(3)
        finally:
            if spy is not None and spy.poll() is None:
                spy.kill()
            events.close()
            for worker in workers:
                worker.stop()
            projector.stop()
            for node in nodes:
                node.stop()
            drop_database(settings.database_url, db_name, db_kind)
        # Runs started in the window: first attempts whose `running` event is in it.
        started = sum(
            1
            for e, _ in events.run_events()
            if e.state == "running" and window_start_ms <= e.at_ms < window_end_ms
        )
        due, on_time, late = window_lateness(events, window_start_ms, window_end_ms - 2000)
        per_run = max(started, 1)
        seconds = (window_end_ms - window_start_ms) / 1000
        cpu_rows: list[dict[str, object]] = []
        for name in after:
            cores = (after[name] - before[name]) / TICK / seconds
            idle_share = idle_cores.get(name, 0.0)
            cpu_rows.append(
                {
                    "process": name,
                    "cores": cores,
                    "cpu_ms_per_run": cores * seconds * 1000 / per_run,
                    # The nodes' CPU with nothing to do, and what is left per run.
                    "idle_cores": idle_share,
                    "net_ms_per_run": (cores - idle_share) * seconds * 1000 / per_run,
                }
            )
        cpu_rows.append(
            {
                key: sum(float(str(r[key])) for r in cpu_rows)
                for key in ("cores", "cpu_ms_per_run", "idle_cores", "net_ms_per_run")
            }
            | {"process": "TOTAL"}
        )
        record_rows: list[dict[str, object]] = [
            {
                "topic": topic,
                "records": offsets_after[topic] - offsets_before.get(topic, 0),
                "per_run": (offsets_after[topic] - offsets_before.get(topic, 0)) / per_run,
            }
            for topic in sorted(offsets_after)
            if offsets_after[topic] != offsets_before.get(topic, 0)
        ]
        idle = (free_after[0] - free_before[0]) / max(1, free_after[1] - free_before[1])
        phases = ledger_phases(raw) if spy_note == "ok" else {}
        code, audit_text = audit(settings)
    table(
        f"CPU per run at {args.rate} runs/s, {args.nodes} node(s) ({started} runs started in "
        f"{seconds:.0f} s; idle_cores: the nodes with no job, over {args.idle_s:.0f} s)",
        cpu_rows,
    )
    table("records per run (end offsets; transaction markers count as offsets)", record_rows)
    table(
        f"ledger main thread, share of wall time (py-spy: {spy_note})",
        [{"phase": k, "share": v} for k, v in phases.items()],
    )
    report(
        "costs",
        {
            "rate_per_s": args.rate,
            "nodes": args.nodes,
            "window_s": seconds,
            "runs_started": started,
            **step_figures(due, on_time, window_start_ms, window_end_ms - 2000, late),
            "machine_idle_share": idle,
            "cpu": cpu_rows,
            "records": record_rows,
            "ledger_phases": phases,
            "py_spy": spy_note,
            "exited": dead,
            "audit": verdict(code),
        },
    )
    print(audit_text.strip())
    print(f"audit: {verdict(code)}")


if __name__ == "__main__":
    main()
