"""Failure detector under load: workers heartbeat every 3 s while every core is saturated
by busy processes; counts false 'declared dead' verdicts of the dispatcher (none of the
workers really fails). `python -m bench.detector --seconds 60 --workers 4`."""

from __future__ import annotations

import argparse
import multiprocessing
import tempfile
import time
from pathlib import Path

from bench.common import bench_settings, report
from tests.support.nodes import Node, WorkerProc


def spin(until: float) -> None:
    while time.time() < until:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--hogs", type=int, default=(multiprocessing.cpu_count() or 1) * 2)
    args = parser.parse_args()
    with bench_settings("detector") as settings, tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        node = Node(settings, "detector-node", logs)
        node.start()
        workers = [WorkerProc(settings, f"dw{i}", logs).start() for i in range(args.workers)]
        time.sleep(15)  # everyone known
        until = time.time() + args.seconds
        hogs = [multiprocessing.Process(target=spin, args=(until,)) for _ in range(args.hogs)]
        for hog in hogs:
            hog.start()
        for hog in hogs:
            hog.join()
        time.sleep(2)
        for worker in workers:
            worker.stop()
        node.stop()
        verdicts = node.log.read_text(errors="replace").count("declared dead")
        heartbeats_expected = int(args.workers * args.seconds / 3.0)
        report(
            "detector",
            {
                "workers": args.workers,
                "busy_processes": args.hogs,
                "seconds": args.seconds,
                "heartbeat_interval_s": 3.0,
                "dead_after_s": 10.0,
                "heartbeats_expected": heartbeats_expected,
                "false_dead_verdicts": verdicts,
                "false_alarm_rate_per_worker_hour": verdicts / args.workers / (args.seconds / 3600),
            },
        )


if __name__ == "__main__":
    main()
