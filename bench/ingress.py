"""Ingress alone: how fast commands become job-log records.

N valid job.upsert commands (1,440 distinct cron expressions, as `bench.registry`) are
put on `commands` first; then the real ingress loop (`streams.ingress.Ingress`) runs in
its own process, alone, no ledger: the time from its first job-log record to the last
(N records on job-log), so the start-up and the group join are left out; with its CPU
seconds from /proc. `python -m bench.ingress --jobs 100000` (`--quick`: 30,000).
(Until 2026-12-03 it also ran a do-nothing Faust agent, Faust's own ceiling: 8,600-9,500
records/s here; docs/performance.md.)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import bench_settings, report, tree_stats
from bench.registry import upsert
from streams.kafka import consumer_config, producer_config
from streams.settings import Settings


def fill(settings: Settings, jobs: int) -> None:
    producer = Producer(producer_config(settings, **{"linger.ms": 50}))
    topic = settings.topic("commands")
    for i in range(jobs):
        job_id = f"ing-{i:07d}"
        while True:
            try:
                producer.produce(topic, key=job_id.encode(), value=upsert(job_id, i))
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.05)
    producer.flush(300)


def end_offsets(settings: Settings, topic: str) -> int:
    probe = Consumer(consumer_config(settings, None))
    try:
        name = settings.topic(topic)
        return sum(
            probe.get_watermark_offsets(TopicPartition(name, p), timeout=10)[1]
            for p in range(settings.partitions)
        )
    finally:
        probe.close()


def child_env(settings: Settings, jobs: int) -> dict[str, str]:
    return {
        **os.environ,
        "CRONLOG_KAFKA": settings.kafka,
        "CRONLOG_TOPIC_PREFIX": settings.topic_prefix,
        "CRONLOG_PARTITIONS": str(settings.partitions),
        "BENCH_JOBS": str(jobs),
    }


def ingress(settings: Settings, jobs: int) -> tuple[float, float]:
    """Records/s of the real ingress loop (job-log's end offsets from the first to N),
    and the CPU seconds its process used in all."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.ingress", "--child"],
        env=child_env(settings, jobs),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        first_at: float | None = None
        first = done = 0
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            done = end_offsets(settings, "job-log")
            if done and first_at is None:
                first_at, first = time.monotonic(), done
            if done >= jobs:
                assert first_at is not None
                rate = (done - first) / max(time.monotonic() - first_at, 1e-9)
                return rate, tree_stats(proc.pid)[1]
            time.sleep(0.25)
        raise RuntimeError(f"ingress produced {done} of {jobs} job-log records in 900 s")
    finally:
        proc.terminate()
        proc.wait(30)


def run_child() -> None:
    from streams.ingress import Ingress

    ingress = Ingress(Settings.from_env())
    signal.signal(signal.SIGTERM, lambda *_: ingress.stop())
    ingress.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run_child()
        return
    jobs = 30_000 if args.quick else args.jobs
    with bench_settings("ingress") as settings:
        fill(settings, jobs)
        rate, cpu_s = ingress(settings, jobs)
    report(
        "ingress",
        {
            "jobs": jobs,
            "ingress_per_s": rate,
            "ingress_cpu_us_per_command": cpu_s / jobs * 1e6,
        },
    )


if __name__ == "__main__":
    main()
