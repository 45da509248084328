"""Real jobs: the sustained scenario with REAL processes (the worker's `process` executor).

One node; three workers offering 4, 2 and 1 CPUs (memory generous, the
default heartbeat); N jobs `every 2s`, each `sh -c 'echo run $CRONLOG_RUN_ID'` asking for 0.1 CPU.
After --seconds (the first --settle-s are not measured) the jobs are paused and the runs
get --drain-s to finish. Over the window it reports the firings due, how many started,
how many reached a final state (by the end of the drain), the start lateness of first
attempts (running.happened_ms - scheduled_ms), the runs still not final, the CPU each process
used (cores, children included: job processes and per-run helpers, reaped ones too) and
the workers' CPU per run. It ends with `cronlog audit` over the run-events written, and
exits non-zero if the audit is not clean.

`--kill-worker-at S` SIGKILLs the 4-CPU worker S seconds into the run and restarts it
5 s later (same id, same state folder), then also reports attempts started twice (two
`running` events for one (run, attempt)), attempts of one run running at overlapping
times, runs `failed` with a `lost` reason, and, from the run-logs topic, attempts whose
output shows they executed twice. Any of those, or a run not final, fails the run.
With `--lost-for-good` the machine is lost instead: the worker, its executor and its
jobs are SIGKILLed together and nothing is restarted; it also reports the `lost` attempts
that never ran (no output in run-logs), which arming bounds to the runs due within
about 2 s of its last beat (docs/architecture.md, "A start is armed before it is made").

`--rates 100,250,500` is the rate mode instead: R jobs `every 1s` (no resources) make R
runs/s, stepped up as in bench/sustained.py, but through real processes; the highest
rate held (p99 start lateness <= 1 s and >= 99% started) is the result.
`--compare-noop` runs the same steps with `--executor noop` too, and prints whether the
process executor reaches >= 80% of noop's rate and >= 250 runs/s.

`python -m bench.realjobs` (300 s), `--quick` (60 s), `--kill-worker-at 30`,
`--rates 100,250,500 --compare-noop` (`--quick`: 20 s steps).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from bench.common import (
    _children,
    audit,
    bench_settings,
    lateness,
    report,
    step_figures,
    table,
    tree_stats,
    verdict,
    window_lateness,
)
from schemas.codec import RUN_LOG, CodecError
from schemas.records import FINAL_STATES, RunEvent
from streams.kafka import connection_config
from streams.settings import Settings
from tests.support.nodes import CronlogProcess, EventReader, Node, WorkerProc, send_commands

COMMAND = ["sh", "-c", "echo run $CRONLOG_RUN_ID"]
WORKER_CPUS = (4, 2, 1)
WORKER_MEMORY_MB = 1_000_000
RESTART_AFTER_S = 5.0


# -- CPU accounting ------------------------------------------------------------------------
def _descendants(pid: int) -> list[int]:
    """Live descendants, whichever thread of a process started them."""
    found: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found + [g for c in found for g in _descendants(c)]


def cpu_s(pid: int) -> float:
    """CPU seconds of a process tree: bench.common.tree_stats (utime + stime of the process
    and its live descendants) plus cutime + cstime of each, so children that already
    exited and were reaped (short jobs, per-run helpers) count too. Processes orphaned to
    init (a SIGKILLed worker's children) are not seen."""
    tick = os.sysconf("SC_CLK_TCK")
    total = tree_stats(pid)[1]
    for p in (pid, *_descendants(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[13]) + int(fields[14])) / tick
    return total


@dataclass
class CpuMeter:
    """CPU seconds per process over a window; a process killed and restarted during it
    is banked before the kill and measured afresh after the restart."""

    procs: list[CronlogProcess]
    base: dict[str, float] = field(default_factory=dict)
    banked: dict[str, float] = field(default_factory=dict)
    started_at: float | None = None
    used: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    def _now(self, proc: CronlogProcess) -> float:
        return cpu_s(proc.proc.pid) if proc.proc is not None and proc.alive else 0.0

    def start(self) -> None:
        self.started_at = time.monotonic()
        self.base = {p.name: self._now(p) for p in self.procs}
        self.banked = {p.name: 0.0 for p in self.procs}

    def before_kill(self, proc: CronlogProcess) -> None:
        if self.started_at is not None:
            self.banked[proc.name] += self._now(proc) - self.base[proc.name]
            self.base[proc.name] = 0.0

    def after_restart(self, proc: CronlogProcess) -> None:
        if self.started_at is not None:
            self.base[proc.name] = self._now(proc)

    def stop(self) -> None:
        assert self.started_at is not None
        self.seconds = time.monotonic() - self.started_at
        self.used = {
            p.name: self.banked[p.name] + self._now(p) - self.base[p.name] for p in self.procs
        }

    def cores(self, name: str) -> float:
        return self.used.get(name, 0.0) / self.seconds if self.seconds else float("nan")


# -- the cluster ---------------------------------------------------------------------------
@dataclass
class Cluster:
    settings: Settings
    node: Node
    workers: list[WorkerProc]
    events: EventReader

    @property
    def procs(self) -> list[CronlogProcess]:
        return [self.node, *self.workers]


@contextmanager
def cluster(name: str, executor: str, logs: Path | None) -> Iterator[Cluster]:
    with bench_settings(name) as settings, tempfile.TemporaryDirectory() as tmp:
        logdir = logs or Path(tmp)
        logdir.mkdir(parents=True, exist_ok=True)
        node = Node(settings, f"{name}-node", logdir).start()
        workers = [
            WorkerProc(
                settings,
                f"rw-{cpu}cpu",
                logdir,
                cpu=cpu,
                memory_mb=WORKER_MEMORY_MB,
            )
            for cpu in WORKER_CPUS
        ]
        for worker in workers:
            worker.argv += ["--executor", executor]
            worker.start()
        events = EventReader(settings, f"bench-{name}")
        try:
            yield Cluster(settings, node, workers, events)
        finally:
            events.close()
            for worker in workers:
                worker.stop()
            node.stop()


def upserts(ids: range, every: str, cpu: float) -> list[bytes | dict[str, object]]:
    commands: list[bytes | dict[str, object]] = []
    for i in ids:
        command: dict[str, object] = {
            "type": "job.upsert",
            "job_id": f"rj-{i:06d}",
            "owner": f"o{i % 10}",
            "schedule": {"every": every},
            "command": COMMAND,
        }
        if cpu:
            command["resources"] = {"cpu": cpu}
        commands.append(command)
    return commands


def pauses(ids: range) -> list[bytes | dict[str, object]]:
    return [{"type": "job.pause", "job_id": f"rj-{i:06d}"} for i in ids]


def last_states(events: EventReader) -> dict[str, RunEvent]:
    latest: dict[str, RunEvent] = {}
    for event, _ in events.run_events():
        latest[event.run_id] = event  # run-events is keyed by job: one run's are in order
    return latest


def run_log_executions(settings: Settings) -> Counter[tuple[str, int]]:
    """How many times each (run, attempt) printed its `run <run_id>` line, from the
    run-logs topic. A worker that re-sends a log after a restart repeats chunks with the
    same seq: per seq only the longest chunk counts."""
    consumer = Consumer(
        {
            **connection_config(settings),
            "group.id": settings.group(f"bench-realjobs-logs-{time.time_ns()}"),
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    topic = settings.topic("run-logs")
    chunks: dict[tuple[str, int, int], str] = {}
    try:
        metadata = consumer.list_topics(topic, timeout=10)
        partitions = sorted(metadata.topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        pending = set(partitions)
        deadline = time.monotonic() + 60
        while pending and time.monotonic() < deadline:
            for msg in consumer.consume(1000, timeout=0.5):
                error = msg.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition())
                    continue
                try:
                    chunk = RUN_LOG.decode(msg.value() or b"")
                except CodecError:
                    continue
                if chunk.stream != "stdout":
                    continue
                key = (chunk.run_id, chunk.attempt, chunk.seq)
                if len(chunk.data) > len(chunks.get(key, "")):
                    chunks[key] = chunk.data
    finally:
        consumer.close()
    executions: Counter[tuple[str, int]] = Counter()
    for (run_id, attempt, _), data in chunks.items():
        executions[(run_id, attempt)] += data.count(f"run {run_id}\n")
    return executions


def overlapping_attempts(events: EventReader) -> int:
    """Runs with two attempts running at overlapping times."""
    spans: dict[str, dict[int, list[float]]] = {}
    for e, _ in events.run_events():
        by_attempt = spans.setdefault(e.run_id, {})
        if e.state == "running":
            by_attempt.setdefault(e.attempt, [float(e.at_ms), float("inf")])[0] = e.at_ms
        elif e.attempt in by_attempt and (e.state in FINAL_STATES or e.state == "retrying"):
            by_attempt[e.attempt][1] = min(by_attempt[e.attempt][1], e.at_ms)
    overlapping = 0
    for by_attempt in spans.values():
        ordered = sorted(by_attempt.values())
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(ordered)):
            overlapping += 1
    return overlapping


# -- the scenario --------------------------------------------------------------------------
def scenario(args: argparse.Namespace) -> int:
    ids = range(args.jobs)
    failures: list[str] = []
    with cluster("realjobs", args.executor, args.logs) as c:
        killed = c.workers[0]  # the 4-CPU one
        meter = CpuMeter(c.procs)
        kill_ms = restart_ms = None
        send_commands(c.settings, upserts(ids, args.every, args.cpu))
        t0 = time.monotonic()
        actions: list[tuple[float, str]] = [(args.settle_s, "window")]
        if args.kill_worker_at is not None:
            actions.append((args.kill_worker_at, "kill"))
            if not args.lost_for_good:
                actions.append((args.kill_worker_at + RESTART_AFTER_S, "restart"))
        actions.append((args.seconds, "end"))
        window_start_ms = window_end_ms = 0
        for at, what in sorted(actions):
            c.events.poll_for(max(0.0, t0 + at - time.monotonic()))
            now_ms = int(time.time() * 1000)
            if what == "window":
                meter.start()
                window_start_ms = now_ms
            elif what == "kill":
                meter.before_kill(killed)
                if args.lost_for_good and killed.proc is not None:
                    for pid in _children(killed.proc.pid):  # its executor and jobs too
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                killed.kill()
                kill_ms = now_ms
                print(f"killed {killed.name} (SIGKILL) at {at:.0f} s", flush=True)
            elif what == "restart":
                killed.start()
                meter.after_restart(killed)
                restart_ms = now_ms
                print(f"restarted {killed.name} at {at:.0f} s", flush=True)
            else:
                meter.stop()
                window_end_ms = now_ms
        rss = {p.name: tree_stats(p.proc.pid)[0] for p in c.procs if p.proc is not None}
        # Stop firing; the runs created ahead for later times are cancelled by the pause.
        send_commands(c.settings, pauses(ids))
        drain_end = time.monotonic() + args.drain_s
        c.events.poll_for(3.0)
        while time.monotonic() < drain_end:
            if all(e.state in FINAL_STATES for e in last_states(c.events).values()):
                break
            c.events.poll_for(1.0)
        drained_s = args.drain_s - max(0.0, drain_end - time.monotonic())

        run_events = [e for e, _ in c.events.run_events()]
        latest = last_states(c.events)
        starts: dict[str, RunEvent] = {}
        start_counts: Counter[tuple[str, int]] = Counter()
        for e in run_events:
            if e.state == "running":
                start_counts[(e.run_id, e.attempt)] += 1
                if e.attempt == 1:
                    starts.setdefault(e.run_id, e)
        window = [
            e
            for e in run_events
            if e.state == "due"
            and e.attempt == 1
            and window_start_ms <= e.scheduled_ms < window_end_ms
        ]
        started = [e for e in window if e.run_id in starts]
        final = [e for e in window if latest[e.run_id].state in FINAL_STATES]
        late = [(starts[e.run_id].happened_ms - e.scheduled_ms) / 1000 for e in started]
        outcomes = Counter(latest[e.run_id].state for e in window)
        failed_why = Counter(
            latest[e.run_id].reason.split(":")[0] or "(none)"
            for e in window
            if latest[e.run_id].state == "failed"
        )
        not_final = [r for r, e in latest.items() if e.state not in FINAL_STATES]
        ran_in_window = sum(
            1
            for e in run_events
            if e.state == "running" and window_start_ms <= e.at_ms < window_end_ms
        )
        window_s = (window_end_ms - window_start_ms) / 1000
        workers_cpu_s = sum(meter.used.get(w.name, 0.0) for w in c.workers)
        code, audit_text = audit(c.settings)

        processes = [
            {
                "process": p.name,
                "cores": meter.cores(p.name),
                "cpu_s": meter.used.get(p.name, 0.0),
                "rss_mb": rss.get(p.name, 0.0),
            }
            for p in c.procs
        ]
        slowest = sorted(started, key=lambda e: e.scheduled_ms - starts[e.run_id].at_ms)[:3]
        for e in slowest:  # where the slowest runs spent their time, for the reader
            history = [
                f"{x.state}@{(x.at_ms - e.scheduled_ms) / 1000:+.1f}s {x.worker_id} {x.reason}"
                for x in run_events
                if x.run_id == e.run_id
            ]
            print(f"slowest: {e.run_id}: " + " | ".join(history))
        figures: dict[str, object] = {
            "executor": args.executor,
            "jobs": args.jobs,
            "every": args.every,
            "job_cpu": args.cpu,
            "workers_cpu": ",".join(str(w) for w in WORKER_CPUS),
            "window_s": window_s,
            "drain_s": drained_s,
            "due_in_window": len(window),
            "due_per_s": len(window) / window_s,
            "started": len(started),
            "started_share": len(started) / len(window) if window else float("nan"),
            "final_after_drain": len(final),
            "outcomes": dict(sorted(outcomes.items())),
            "failed_reasons": dict(failed_why.most_common()),
            **lateness(late),
            "runs_not_final": len(not_final),
            "runs_started_in_window": ran_in_window,
            "started_per_s": ran_in_window / window_s,
            "node_cores": meter.cores(c.node.name),
            "workers_cores": workers_cpu_s / meter.seconds,
            "worker_cpu_per_run_ms": (
                1000 * workers_cpu_s / ran_in_window if ran_in_window else float("nan")
            ),
            "audit": verdict(code),
        }
        if args.kill_worker_at is not None:
            twice = sum(1 for n in start_counts.values() if n > 1)
            overlapping = overlapping_attempts(c.events)
            lost = sum(1 for e in run_events if e.state == "failed" and e.reason.startswith("lost"))
            executions = run_log_executions(c.settings) if args.executor == "process" else Counter()
            lost_runs = {
                (e.run_id, e.attempt)
                for e in run_events
                if e.state == "failed" and e.reason.startswith("lost")
            }
            figures |= {
                "killed": killed.name,
                "killed_at_s": args.kill_worker_at,
                "restarted_after_s": (
                    (restart_ms - kill_ms) / 1000 if restart_ms and kill_ms else float("nan")
                ),
                "attempts_started_twice": twice,
                "runs_with_overlapping_attempts": overlapping,
                "failed_lost": lost,
                "attempts_executed_twice_in_run_logs": sum(1 for n in executions.values() if n > 1),
                "lost_attempts_with_output": sum(1 for k in lost_runs if executions.get(k)),
                "lost_attempts_never_run": sum(1 for k in lost_runs if not executions.get(k)),
                "lost_for_good": args.lost_for_good,
            }
            if twice:
                failures.append(f"{twice} attempts started twice")
            if overlapping:
                failures.append(f"{overlapping} runs with overlapping attempts")
            if not_final:
                failures.append(f"{len(not_final)} runs not final, e.g. {not_final[:3]}")
            if figures["attempts_executed_twice_in_run_logs"]:
                failures.append("attempts executed twice (run-logs)")
    table("realjobs: CPU per process (cores over the window, children included)", processes)
    print("\naudit\n" + "\n".join("  " + line for line in audit_text.splitlines()))
    name = "realjobs" if args.kill_worker_at is None else "realjobs-kill"
    report(name, {**figures, "processes": processes})
    if code != 0:
        failures.append(f"audit not clean (exit {code})")
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


# -- the rate mode -------------------------------------------------------------------------
def rate_steps(
    args: argparse.Namespace, executor: str, say: Callable[[list[dict[str, object]]], None]
) -> tuple[list[dict[str, object]], int]:
    rates = [int(r) for r in args.rates.split(",")]
    rows: list[dict[str, object]] = []
    with cluster(f"realjobs-rates-{executor}", executor, args.logs) as c:
        events = c.events
        registered = 0
        for rate in rates:
            send_commands(c.settings, upserts(range(registered, rate), "1s", 0.0))
            registered = rate
            events.poll_for(15)  # pre-dispatch lead (10 s) plus the registration
            meter = CpuMeter(c.procs)
            meter.start()
            window_start_ms = int(time.time() * 1000)
            events.poll_for(args.step_s)
            window_end_ms = int(time.time() * 1000) - 2000  # let the last second start
            events.poll_for(3)
            meter.stop()
            meter_end_ms = int(time.time() * 1000)
            due, started, late = window_lateness(events, window_start_ms, window_end_ms)
            figures = lateness(late)
            ran = sum(
                1
                for e, _ in events.run_events()
                if e.state == "running" and window_start_ms <= e.at_ms < meter_end_ms
            )
            workers_cpu_s = sum(meter.used.get(w.name, 0.0) for w in c.workers)
            held = started >= 0.99 * due and figures["start_lateness_p99_s"] <= 1.0
            rows.append(
                {
                    "executor": executor,
                    "rate": rate,
                    **step_figures(due, started, window_start_ms, window_end_ms, late),
                    "node_cores": meter.cores(c.node.name),
                    "workers_cores": workers_cpu_s / meter.seconds,
                    "worker_cpu_per_run_ms": 1000 * workers_cpu_s / ran if ran else float("nan"),
                    "held": held,
                }
            )
            # Runs of later windows were created up to 10 s ahead: keep only those.
            events.seen = [
                s for s in events.seen if getattr(s.event, "scheduled_ms", 0) >= window_end_ms
            ]
            say(rows)
            if not held:
                break
        send_commands(c.settings, pauses(range(registered)))
        events.poll_for(3)
        code, audit_text = audit(c.settings)
    print(f"\naudit ({executor})\n" + "\n".join("  " + line for line in audit_text.splitlines()))
    return rows, code


def rates_mode(args: argparse.Namespace) -> int:
    everything: list[dict[str, object]] = []

    def say(rows: list[dict[str, object]]) -> None:
        table("realjobs rates (so far)", [*everything, *rows])

    executors = [args.executor] + (
        ["noop"] if args.compare_noop and args.executor != "noop" else []
    )
    best: dict[str, int] = {}
    codes: dict[str, int] = {}
    for executor in executors:
        rows, codes[executor] = rate_steps(args, executor, say)
        everything += rows
        best[executor] = max((int(str(r["rate"])) for r in rows if r["held"]), default=0)
    table("realjobs rates", everything)
    figures: dict[str, object] = {
        "step_s": args.step_s,
        **{f"highest_rate_held_{e}_per_s": best[e] for e in executors},
        **{f"audit_{e}": verdict(codes[e]) for e in executors},
    }
    if "noop" in best and args.executor != "noop":
        ratio = best[args.executor] / best["noop"] if best["noop"] else float("nan")
        figures |= {
            "process_vs_noop": ratio,
            "target_80pct_of_noop": "met" if ratio >= 0.8 else "NOT met",
        }
    figures["target_250_per_s"] = "met" if best[args.executor] >= 250 else "NOT met"
    report("realjobs-rates", {**figures, "steps": everything})
    bad = [e for e, code in codes.items() if code != 0]
    for executor in bad:
        print(f"FAIL: audit not clean ({executor})", file=sys.stderr)
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--every", default="2s")
    parser.add_argument("--cpu", type=float, default=0.1, help="CPU each job asks for")
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--settle-s", type=float, default=15.0, help="not measured")
    parser.add_argument("--drain-s", type=float, default=30.0)
    parser.add_argument("--executor", choices=("process", "noop"), default="process")
    parser.add_argument("--kill-worker-at", type=float, default=None, metavar="S")
    parser.add_argument(
        "--lost-for-good",
        action="store_true",
        help="with --kill-worker-at: the worker's whole machine is lost, never restarted",
    )
    parser.add_argument(
        "--rates", nargs="?", const="100,250,500", default=None, help="the rate mode"
    )
    parser.add_argument("--step-s", type=float, default=60.0)
    parser.add_argument("--compare-noop", action="store_true")
    parser.add_argument("--quick", action="store_true", help="60 s; 20 s rate steps")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.step_s = 60.0, 20.0
    if args.kill_worker_at is not None and not (
        args.kill_worker_at >= 0 and args.kill_worker_at + RESTART_AFTER_S < args.seconds
    ):
        parser.error("--kill-worker-at must leave the restart (5 s later) inside --seconds")
    sys.exit(rates_mode(args) if args.rates else scenario(args))


if __name__ == "__main__":
    main()
