"""Outage: J jobs `every 1s`, every node killed for D seconds, then restarted.

The jobs are registered, every node is killed at once, and D seconds later (an operator
paused every job meanwhile: the commands wait in `commands`, stamped with their time)
the nodes restart. Each job then has D seconds of undecided firings, decided in one
catch-up by its first late proposal or by its pause, which decides every firing up to
its own time: at most 1,000 recorded (`max_catchup_runs`; the default misfire policy
runs those within the 60 s grace and records the rest as skipped), some 2,000 records
per job, a few million in all, all at once after the restart. The ledger must work
through it in transactions bounded by its budget (none aborted by the transaction
timeout, no `BufferError`, no crash), and the audit of `run-events` must be clean. No
workers: the runs stay due (the audit gives them their allowance).

Why the pause: 2,000 jobs every second is more than this 2-core machine decides in
steady state (about a thousand decisions a second per core); left running after the
restart, the unanswered proposals (repeated every 3 s) and the claim deadlines of runs
nobody claims grow `job-log` faster than any ledger here reads it. That is a capacity
limit, not the subject; the pause ends the load where the catch-up ends.

Reports how long until every job was paused (its outage decided), the ledger's cut and
aborted transactions and crashes (from the node logs), and the audit's verdict.
`python -m bench.outage --jobs 2000 --outage-s 1200` (`make chaos`); `--quick`: 200 jobs,
120 s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from bench.common import audit, bench_settings, report, verdict
from schemas.codec import RUN_EVENTS, CodecError
from schemas.records import JobEvent, RunEvent
from streams.kafka import connection_config
from streams.settings import Settings
from tests.support.nodes import Node, send_commands


class Progress:
    """Follows run-events, keeping per job only what the benchmark needs (millions of
    events do not fit a list of records)."""

    def __init__(self, settings: Settings) -> None:
        self.topic = settings.topic("run-events")
        self.consumer = Consumer(
            {
                **connection_config(settings),
                "group.id": settings.group("bench-outage"),
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self.consumer.assign([TopicPartition(self.topic, p, 0) for p in range(settings.partitions)])
        self.latest: dict[str, int] = {}  # job -> newest scheduled time with a run event
        self.kinds: dict[str, int] = {}  # job event kind -> count
        self.run_events = 0
        self.skipped = 0

    def poll_for(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for msg in self.consumer.consume(5000, timeout=0.2):
                if msg.error() is not None or not msg.value():
                    continue
                try:
                    event = RUN_EVENTS.decode(msg.value() or b"")
                except CodecError:
                    continue
                if isinstance(event, JobEvent):
                    self.kinds[event.kind] = self.kinds.get(event.kind, 0) + 1
                elif isinstance(event, RunEvent):
                    self.run_events += 1
                    self.skipped += event.state == "skipped"
                    if event.scheduled_ms > self.latest.get(event.job_id, 0):
                        self.latest[event.job_id] = event.scheduled_ms

    def wait(self, done: object, timeout_s: float, what: str) -> float:
        assert callable(done)
        started = time.monotonic()
        while not done():
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")
            self.poll_for(1.0)
        return time.monotonic() - started

    def close(self) -> None:
        self.consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--outage-s", type=float, default=1200.0)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--misfire", default="run_once", choices=["run_once", "run_all", "skip"])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args()
    jobs, outage_s = (200, 120.0) if args.quick else (args.jobs, args.outage_s)
    ids = [f"out-{i:05d}" for i in range(jobs)]
    with bench_settings("outage") as settings, tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        nodes = [Node(settings, f"outage-{i}", logs) for i in range(1, args.nodes + 1)]
        for node in nodes:
            node.argv[node.argv.index("warning")] = "info"
            node.start()
        progress = Progress(settings)
        try:
            send_commands(
                settings,
                [
                    {
                        "type": "job.upsert",
                        "job_id": job_id,
                        "owner": "o",
                        "schedule": {"every": "1s"},
                        "command": ["true"],
                        "misfire": args.misfire,
                    }
                    for job_id in ids
                ],
            )
            progress.wait(
                lambda: progress.kinds.get("upserted", 0) >= jobs, 600, "every job registered"
            )
            for node in nodes:
                node.kill()
            stopped = time.monotonic()
            print(f"all {len(nodes)} nodes killed; outage of {outage_s:.0f} s", flush=True)
            time.sleep(outage_s)
            paused_ms = int(time.time() * 1000)
            send_commands(settings, [{"type": "job.pause", "job_id": j} for j in ids])
            restarted = time.monotonic()
            for node in nodes:
                node.start()
            print(f"nodes restarted after {restarted - stopped:.0f} s", flush=True)
            recovered_s = progress.wait(
                lambda: progress.kinds.get("paused", 0) >= jobs, 3600, "every job paused"
            )
            progress.poll_for(5.0)
            behind = [j for j in ids if progress.latest.get(j, 0) < paused_ms - 1000]
            alive = all(node.alive for node in nodes)
        finally:
            progress.close()
            for node in nodes:
                node.stop()
        text = "\n".join(n.log.read_text(errors="replace") for n in nodes)
        code, audit_report = audit(settings)
        print(audit_report)
    report(
        "outage",
        {
            "jobs": jobs,
            "nodes": len(nodes),
            "outage_s": outage_s,
            "misfire": args.misfire,
            "all_decided_after_restart_s": recovered_s,
            "jobs_not_decided_to_their_pause": len(behind),
            "run_events": progress.run_events,
            "skipped_events": progress.skipped,
            "ledger_transactions_cut": text.count("transaction cut by its budget"),
            "ledger_transactions_failed": text.count("transaction failed"),
            "ledger_crashes": text.count("ledger process exited"),
            "buffer_errors": text.count("BufferError"),
            "nodes_alive_at_end": alive,
            "audit": verdict(code),
        },
    )
    if code != 0 or not alive or behind or "ledger process exited" in text:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
