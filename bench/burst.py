"""Burst: N jobs all due in the same second, with pre-dispatch on.

One-off jobs by default; `--schedule cron` gives every job a daily cron expression (with
seconds) in Europe/Berlin that fires at that second: the top-of-the-hour case, with the
cron and time-zone work it costs.

Prints p50/p99/max start lateness (the worker's actual start minus the scheduled time)
and the time until every run finished, then runs the audit over the run events (a
non-zero exit if it is not clean). `python -m bench.burst --jobs 2000`;
`--executor process --command sh` for real `sh -c` processes, which also measures the
floor: the same starts by posix_spawn alone, one starter per worker, nothing else running.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from bench.common import audit, bench_settings, percentile, report, verdict
from bench.spawn import burst_floor
from tests.support.nodes import EventReader, Node, WorkerProc, send_commands

COMMANDS = {"true": ["true"], "sh": ["sh", "-c", "echo burst $CRONLOG_RUN_ID"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="10,000 jobs")
    parser.add_argument(
        "--lead-s", type=float, default=10.0, help="pre-dispatch lead; 0 turns it off"
    )
    parser.add_argument(
        "--lookahead-s", type=float, default=None, help="the node's look-ahead (default its own)"
    )
    parser.add_argument("--lookahead-rate", type=float, default=None)
    parser.add_argument("--max-lead-s", type=float, default=None)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--keep-logs", type=Path, default=None, help="write the processes' logs here and keep them"
    )
    parser.add_argument("--executor", choices=("noop", "process"), default="noop")
    parser.add_argument("--schedule", choices=("at", "cron"), default="at")
    parser.add_argument(
        "--spread-s",
        type=int,
        default=1,
        help="the jobs are due over this many seconds (job i in second i mod N): 60 is "
        "everything due in the same minute",
    )
    parser.add_argument(
        "--command",
        choices=("true", "sh"),
        default="true",
        help="each job runs `true`, or `sh -c 'echo burst $CRONLOG_RUN_ID'`",
    )
    parser.add_argument(
        "--lead-in-s",
        type=float,
        default=None,
        help="how far ahead the burst is scheduled (default: 35 s + 2 ms per job, and at "
        "least --lookahead-s + 70 s: the node's start and the registrations must be done "
        "before pre-dispatch begins)",
    )
    args = parser.parse_args()
    if args.quick:
        args.jobs = 10_000
    if args.lead_in_s is None:
        args.lead_in_s = 35.0 + args.jobs / 500
        if args.lookahead_s is not None:  # the whole look-ahead after the registrations
            args.lead_in_s = max(args.lead_in_s, args.lookahead_s + 70.0)
    with bench_settings("burst") as settings, tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp) if args.keep_logs is None else args.keep_logs
        logs.mkdir(parents=True, exist_ok=True)
        node = Node(settings, "bench-node", logs)
        node.argv += ["--lead-s", str(args.lead_s)]
        for option in ("lookahead_s", "lookahead_rate", "max_lead_s"):
            if getattr(args, option) is not None:
                node.argv += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
        node.start()
        workers = [
            WorkerProc(settings, f"bw{i}", logs, cpu=1000, memory_mb=10**6)
            for i in range(args.workers)
        ]
        for worker in workers:
            worker.argv += ["--executor", args.executor]
            worker.start()
        events = EventReader(settings, "bench")
        try:
            due_s = int(time.time() + args.lead_in_s)

            def schedule(i: int) -> dict[str, str]:
                second = due_s + i % args.spread_s
                if args.schedule == "at":
                    return {
                        "at": datetime.fromtimestamp(second, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
                    }
                wall = datetime.fromtimestamp(second, tz=ZoneInfo("Europe/Berlin"))
                return {
                    "cron": f"{wall.second} {wall.minute} {wall.hour} * * *",
                    "timezone": "Europe/Berlin",
                }

            started = time.monotonic()
            send_commands(
                settings,
                [
                    {
                        "type": "job.upsert",
                        "job_id": f"burst-{i:06d}",
                        "owner": f"o{i % 10}",
                        "schedule": schedule(i),
                        "command": COMMANDS[args.command],
                    }
                    for i in range(args.jobs)
                ],
            )
            registered_s = time.monotonic() - started
            finished: dict[str, int] = {}
            starts: dict[str, int] = {}  # run -> its start, ms after its due time
            recorded: dict[str, int] = {}  # run -> the ledger's record of its start
            granted: dict[str, int] = {}  # run -> its claim granted, ms after its due time
            deadline = time.time() + args.lead_in_s + 300
            while len(finished) < args.jobs and time.time() < deadline:
                events.poll_for(1.0)
                for event, _ in events.run_events():
                    if event.state == "dispatched":
                        granted[event.run_id] = event.at_ms - event.scheduled_ms
                    elif event.state == "running":
                        starts[event.run_id] = event.happened_ms - event.scheduled_ms
                        recorded[event.run_id] = event.at_ms - event.scheduled_ms
                    elif event.state == "succeeded":
                        finished[event.run_id] = event.at_ms
            lateness = [ms / 1000 for ms in starts.values()]
            records = [ms / 1000 for ms in recorded.values()]
            if len(finished) < args.jobs:
                by_run: dict[str, list[str]] = {}
                for event, _ in events.run_events():
                    by_run.setdefault(event.run_id, []).append(
                        f"{event.state} ({event.reason})" if event.reason else event.state
                    )
                stuck = {r: s for r, s in by_run.items() if r not in finished}
                print("unfinished:", len(stuck), list(stuck.items())[:5])
            code, audit_report = audit(settings)
            print(audit_report)
            floor: list[float] = []
            if args.executor == "process":
                # The same starts with nothing of cronlog in the way, on the same
                # machine, one starter per worker: the best lateness fork/exec allows.
                spawned = Path(tmp) / "floor"
                spawned.mkdir()
                floor = burst_floor(COMMANDS[args.command], args.jobs, args.workers, spawned)
            p99 = percentile(lateness, 0.99)
            floor_p99 = percentile(floor, 0.99) if floor else float("nan")
            report(
                f"burst-{args.schedule}-{args.executor}-{args.command}-lead{args.lead_s:g}"
                + (f"-spread{args.spread_s}" if args.spread_s > 1 else ""),
                {
                    "jobs": args.jobs,
                    "spread_s": args.spread_s,
                    "schedule": args.schedule,
                    "workers": args.workers,
                    "executor": args.executor,
                    "pre_dispatch_lead_s": args.lead_s,
                    "lookahead_s": args.lookahead_s,
                    "lookahead_rate": args.lookahead_rate,
                    "max_lead_s": args.max_lead_s,
                    "registration_s": registered_s,
                    "runs_started": len(starts),
                    "runs_succeeded": len(finished),
                    # Where the lateness comes from: claims granted after the due time
                    # (the look-ahead did not get the run placed and claimed in time).
                    "granted_after_due": sum(ms > 0 for ms in granted.values()),
                    "granted_p99_s": percentile([ms / 1000 for ms in granted.values()], 0.99),
                    # When the workers started the runs (their start stamps, broker time
                    # by each worker's broker clock, as the ledger vouched for them): the
                    # lateness the audit and the run history report.
                    "start_lateness_p50_s": percentile(lateness, 0.5),
                    "start_lateness_p99_s": p99,
                    "start_lateness_max_s": max(lateness, default=float("nan")),
                    # When the ledger recorded each start: later, by the time the reports
                    # took through worker-reports, the gate and job-log.
                    "recorded_p50_s": percentile(records, 0.5),
                    "recorded_p99_s": percentile(records, 0.99),
                    "recorded_max_s": max(records, default=float("nan")),
                    # Real processes: the same starts by posix_spawn alone (bench.spawn's
                    # burst_floor), and how far above that floor the burst's p99 is.
                    "fork_floor_p50_s": percentile(floor, 0.5) if floor else float("nan"),
                    "fork_floor_p99_s": floor_p99,
                    "p99_over_floor": p99 / floor_p99 if floor else float("nan"),
                    "all_finished_after_due_s": (
                        max(finished.values(), default=0) / 1000 - due_s - args.spread_s + 1
                    ),
                    "audit": verdict(code),
                },
            )
            if code != 0:
                raise SystemExit(f"the audit is not clean ({verdict(code)})")
        finally:
            events.close()
            for worker in workers:
                worker.stop()
            node.stop()


if __name__ == "__main__":
    main()
