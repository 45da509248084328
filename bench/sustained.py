"""Sustained: a steady aggregate firing rate, stepped up.

R jobs `every 1s` make R runs/s. Each step adds jobs up to the next rate, lets
pre-dispatch settle, then for --step-s seconds measures the start lateness of the runs
due in the window (the noop worker's start minus the scheduled time), how many of them
started, and the CPU each process used (cores). The highest rate held with p99 under 1 s
is the result; the step after it shows where it breaks. Each step also gives the broker's
cores and the machine's idle share (from /proc): whether the step broke on one process or
on the two cores. `cronlog audit` over the whole run ends it.
`python -m bench.sustained --rates 250,500,1000,2000,4000 --step-s 60` (`--quick`: 250,
500, 1000 for 20 s).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from bench.common import (
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
from bench.costs import machine_ticks, process_ticks
from connectors.stack import Stack, StackPaths
from tests.support.nodes import EventReader, Node, WorkerProc, send_commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rates", default="250,500,1000,2000,4000")
    parser.add_argument("--step-s", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.rates, args.step_s = "250,500,1000", 20.0
    rates = [int(r) for r in args.rates.split(",")]
    rows: list[dict[str, object]] = []
    broker_pid = Stack(StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))).status().kafka.pid
    with bench_settings("sustained") as settings, tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        node = Node(settings, "sus-node", logs).start()
        workers = [
            WorkerProc(settings, f"sw{i}", logs, cpu=100_000, memory_mb=10**8)
            for i in range(args.workers)
        ]
        for worker in workers:
            worker.argv += ["--executor", "noop"]
            worker.start()
        events = EventReader(settings, "bench-sustained")
        registered = 0
        try:
            for rate in rates:
                send_commands(
                    settings,
                    [
                        {
                            "type": "job.upsert",
                            "job_id": f"sus-{i:06d}",
                            "owner": f"o{i % 10}",
                            "schedule": {"every": "1s"},
                            "command": ["true"],
                        }
                        for i in range(registered, rate)
                    ],
                )
                registered = rate
                events.poll_for(15)  # pre-dispatch lead (10 s) plus the registration
                cpu_before = {p.name: tree_stats(p.proc.pid)[1] for p in [node, *workers] if p.proc}
                broker_before, free_before = process_ticks(broker_pid), machine_ticks()
                window_start_ms = int(time.time() * 1000)
                events.poll_for(args.step_s)
                window_end_ms = int(time.time() * 1000) - 2000  # let the last second start
                events.poll_for(3)
                cpu = {
                    p.name: (tree_stats(p.proc.pid)[1] - cpu_before[p.name]) / (args.step_s + 3)
                    for p in [node, *workers]
                    if p.proc
                }
                broker_s = process_ticks(broker_pid) - broker_before
                free_after = machine_ticks()
                idle = (free_after[0] - free_before[0]) / max(1, free_after[1] - free_before[1])
                due, started, late = window_lateness(events, window_start_ms, window_end_ms)
                figures = lateness(late)
                row: dict[str, object] = {
                    "rate": rate,
                    **step_figures(due, started, window_start_ms, window_end_ms, late),
                    "node_cores": cpu.get(node.name, 0.0),
                    "workers_cores": sum(v for k, v in cpu.items() if k != node.name),
                    "broker_cores": broker_s / (args.step_s + 3),
                    "machine_idle": idle,
                }
                rows.append(row)
                # Runs of later windows were created up to 10 s ahead: keep only those.
                events.seen = [
                    s for s in events.seen if getattr(s.event, "scheduled_ms", 0) >= window_end_ms
                ]
                table("sustained (so far)", rows)
                held = started >= 0.99 * due and figures["start_lateness_p99_s"] < 1.0
                if not held:
                    break
        finally:
            events.close()
            for worker in workers:
                worker.stop()
            node.stop()
        code, audit_text = audit(settings)
    held_rates = [
        int(str(r["rate"]))
        for r in rows
        if float(str(r["p99_s"])) < 1.0 and int(str(r["started"])) >= 0.99 * int(str(r["due"]))
    ]
    table("sustained", rows)
    report(
        "sustained",
        {
            "highest_rate_held_per_s": max(held_rates, default=0),
            "step_s": args.step_s,
            "steps": rows,
            "audit": verdict(code),
        },
    )
    print(audit_text.strip())
    print(f"audit: {verdict(code)}")


if __name__ == "__main__":
    main()
