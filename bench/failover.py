"""Failover: two nodes and two noop workers under a steady load of J jobs
`every 1s`; kill -9 one node. Reports the start lateness of runs due in the failover
window (from 1 s before the kill to 20 s after), and how long until every job fired
again after the kill (the survivor took over the dead node's partitions).
`python -m bench.failover --jobs 200` (`--quick`: 100 jobs, shorter phases).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from bench.common import audit, bench_settings, lateness, report, verdict
from tests.support.nodes import EventReader, Node, WorkerProc, send_commands


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args()
    jobs = 100 if args.quick else args.jobs
    before_s, after_s = (15.0, 45.0) if args.quick else (30.0, 60.0)
    with bench_settings("failover") as settings, tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        nodes = [Node(settings, f"fo-{i}", logs) for i in (1, 2)]
        for n in nodes:
            n.argv[n.argv.index("warning")] = "info"
            n.start()
        workers = [
            WorkerProc(settings, f"fw{i}", logs, cpu=100_000, memory_mb=10**8) for i in (1, 2)
        ]
        for worker in workers:
            worker.argv += ["--executor", "noop"]
            worker.start()
        events = EventReader(settings, "bench-failover")
        try:
            send_commands(
                settings,
                [
                    {
                        "type": "job.upsert",
                        "job_id": f"fo-{i:05d}",
                        "owner": "o",
                        "schedule": {"every": "1s"},
                        "command": ["true"],
                    }
                    for i in range(jobs)
                ],
            )
            events.wait_until(
                lambda: (
                    len({e.job_id for e, _ in events.run_events() if e.state == "running"}) == jobs
                ),
                180,
                "every job to run once",
            )
            events.poll_for(before_s)
            killed_ms = int(time.time() * 1000)
            nodes[0].kill()
            events.poll_for(after_s)
        finally:
            events.close()
            for worker in workers:
                worker.stop()
            for n in nodes:
                n.stop()
        code, audit_text = audit(settings)
    starts = {e.run_id: e for e, _ in events.run_events() if e.state == "running"}
    window = [
        (starts[e.run_id].happened_ms - e.scheduled_ms) / 1000
        for e, _ in events.run_events()
        if e.state == "due"
        and e.attempt == 1
        and killed_ms - 1000 <= e.scheduled_ms <= killed_ms + 20_000
        and e.run_id in starts
    ]
    due_in_window = sum(
        1
        for e, _ in events.run_events()
        if e.state == "due"
        and e.attempt == 1
        and killed_ms - 1000 <= e.scheduled_ms <= killed_ms + 20_000
    )
    # When each job next got a run created after the kill: the survivor's takeover.
    first_after: dict[str, int] = {}
    for e, written_ms in events.run_events():
        if e.state == "due" and written_ms > killed_ms and e.job_id not in first_after:
            first_after[e.job_id] = written_ms
    refire = [(ms - killed_ms) / 1000 for ms in first_after.values()]
    report(
        "failover",
        {
            "jobs": jobs,
            "runs_due_in_window": due_in_window,
            "runs_started_in_window": len(window),
            **lateness(window, "window_start_lateness"),
            "all_jobs_fired_again_after_s": max(refire, default=float("nan")),
            "jobs_fired_again": len(first_after),
            "audit": verdict(code),
        },
    )
    print(audit_text.strip())
    print(f"audit: {verdict(code)}")


if __name__ == "__main__":
    main()
