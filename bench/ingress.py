"""Ingress alone: how fast commands become job-log records, and what Faust itself allows.

N valid job.upsert commands (1,440 distinct cron expressions, as `bench.registry`) are
put on `commands` first; then, each in its own process, over the same records:
- `faust_noop`: a Faust agent that only counts what `take_events` hands it (the
  framework's own ceiling on this machine: consume, event objects, acks);
- `ingress`: the real ingress agent (`streams.ingress`), alone, no ledger: the time from
  its start to the last job-log record produced (N records on job-log).
Rates are records/s after the first record is seen (the start-up and the group join are
left out). `python -m bench.ingress --jobs 100000` (`--quick`: 30,000).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.common import bench_settings, report
from bench.registry import upsert
from streams.kafka import consumer_config, producer_config
from streams.settings import Settings


def fill(settings: Settings, jobs: int) -> None:
    producer = Producer(producer_config(settings, **{"linger.ms": 50}))
    topic = settings.topic("commands")
    for i in range(jobs):
        job_id = f"ing-{i:07d}"
        producer.produce(topic, key=job_id.encode(), value=upsert(job_id, i))
        if i % 10_000 == 0:
            while len(producer) > 100_000:
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


def faust_noop(settings: Settings, jobs: int) -> float:
    """Records/s through a do-nothing agent (the child prints its own rate)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.ingress", "--child", "noop"],
        env=child_env(settings, jobs),
        capture_output=True,
        text=True,
        timeout=900,
    )
    # Faust's worker redirects print() into its log (stderr): look in both.
    found = re.search(r"RATE ([\d.]+)", out.stdout + out.stderr)
    if found:
        return float(found.group(1))
    raise RuntimeError(f"the Faust child printed no rate:\n{out.stdout}\n{out.stderr[-3000:]}")


def ingress(settings: Settings, jobs: int) -> float:
    """Records/s of the real ingress agent: job-log's end offsets from the first to N."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.ingress", "--child", "ingress"],
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
                return (done - first) / max(time.monotonic() - first_at, 1e-9)
            time.sleep(0.25)
        raise RuntimeError(f"ingress produced {done} of {jobs} job-log records in 900 s")
    finally:
        proc.terminate()
        proc.wait(30)


def run_child(kind: str) -> None:
    import faust

    from streams.ingress import build_app

    settings = Settings.from_env()
    jobs = int(os.environ["BENCH_JOBS"])
    if kind == "ingress":
        app = build_app(settings)
    else:
        app = faust.App(
            f"{settings.topic_prefix}noop",
            broker=f"kafka://{settings.kafka}",
            store="memory://",
            web_enabled=False,
            topic_partitions=settings.partitions,
            consumer_auto_offset_reset="earliest",
            datadir=f"/tmp/{settings.topic_prefix}noop-{os.getpid()}",
        )
        source = app.topic(
            settings.topic("commands"),
            key_type=bytes,
            value_type=bytes,
            key_serializer="raw",
            value_serializer="raw",
        )
        seen = {"n": 0, "at": 0.0}

        @app.agent(source, concurrency=1)
        async def noop(stream: faust.StreamT[bytes]) -> None:
            async for events in stream.take_events(1000, within=0.05):  # type: ignore[attr-defined]
                if not seen["n"]:
                    seen["at"] = time.monotonic()
                seen["n"] += len(events)
                if seen["n"] >= jobs:
                    rate = seen["n"] / max(time.monotonic() - seen["at"], 1e-9)
                    print(f"RATE {rate:.1f}", flush=True)
                    os._exit(0)

    faust.Worker(app, loglevel="warning", quiet=True).execute_from_commandline()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--child", choices=("noop", "ingress"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        sys.argv = [sys.argv[0], "worker"]
        run_child(args.child)
        return
    jobs = 30_000 if args.quick else args.jobs
    with bench_settings("ingress") as settings:
        fill(settings, jobs)
        noop = faust_noop(settings, jobs)
        real = ingress(settings, jobs)
    report(
        "ingress",
        {
            "jobs": jobs,
            "faust_noop_per_s": noop,
            "ingress_per_s": real,
            "ingress_share_of_faust": real / noop,
        },
    )


if __name__ == "__main__":
    main()
