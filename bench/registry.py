"""Registry: register N jobs (yearly crons, so nothing fires), then measure

- registration throughput: commands produced, until the ledger has applied them all
  (its consumer group has no lag on job-log and ingress none on commands);
- the node's resident memory with N jobs held (5 s after all were applied), and
  the fresh node's at its readiness and 10 s later;
- takeover: a fresh node started after the first is killed: the time until its ledger
  has restored every partition's state (from its log line: `takeover_ready_s`, from the
  node's start) and until its scheduler has caught up with every partition
  (`takeover_scheduler_ready_s`).
`python -m bench.registry --jobs 1000000` (`--quick`: 50,000).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import orjson
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from bench.common import audit, bench_settings, report, rss_split, tree_stats, verdict
from streams.kafka import admin_config, connection_config, producer_config
from streams.settings import Settings
from tests.support.nodes import CronlogProcess


def lag(settings: Settings, group: str, topic: str) -> int:
    admin = AdminClient(admin_config(settings))
    name = settings.topic(topic)
    partitions = [TopicPartition(name, p) for p in range(settings.partitions)]
    request = [ConsumerGroupTopicPartitions(settings.group(group), partitions)]
    future = admin.list_consumer_group_offsets(request)[settings.group(group)]
    committed = {tp.partition: tp.offset for tp in future.result(30).topic_partitions}
    probe = Consumer({**connection_config(settings), "group.id": "bench-lag"})
    try:
        total = 0
        for p in range(settings.partitions):
            _, high = probe.get_watermark_offsets(TopicPartition(name, p), timeout=10)
            total += max(0, high - max(committed.get(p, 0), 0))
        return total
    finally:
        probe.close()


def upsert(job_id: str, i: int) -> bytes:
    """The i-th registration: a yearly cron (nothing fires), 1,440 distinct expressions."""
    command = {
        "type": "job.upsert",
        "job_id": job_id,
        "owner": f"o{i % 100}",
        "schedule": {"cron": f"{i % 60} {i % 24} 1 1 *", "timezone": "UTC"},
        "command": ["true"],
    }
    return orjson.dumps(command)


def node(settings: Settings, name: str, logs: Path, store: str, ledgers: int) -> CronlogProcess:
    argv = ["scheduler", "--node-id", name, "--loglevel", "info", "--ledgers", str(ledgers)]
    if store == "memory":  # the ledger's encoded states on the heap, not in RocksDB
        argv += ["--state-store", "memory"]
    return CronlogProcess(settings, name, logs, argv)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--store",
        choices=("disk", "memory"),
        default="disk",
        help="where the ledger holds the states it is not deciding about (--state-store)",
    )
    parser.add_argument("--ledgers", type=int, default=1, help="the node's --ledgers")
    args = parser.parse_args()
    jobs = 50_000 if args.quick else args.jobs
    with bench_settings("registry") as settings, tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        first = node(settings, "reg-1", logs, args.store, args.ledgers).start()
        try:
            producer = Producer(producer_config(settings, **{"linger.ms": 50}))
            topic = settings.topic("commands")
            started = time.monotonic()
            for i in range(jobs):
                job_id = f"reg-{i:07d}"
                while True:
                    try:
                        producer.produce(topic, key=job_id.encode(), value=upsert(job_id, i))
                        break
                    except BufferError:  # the local queue is full: let deliveries drain it
                        producer.poll(0.05)
                if i % 10_000 == 0:
                    producer.poll(0)
            producer.flush(300)
            produced_s = time.monotonic() - started
            peak_rss = 0.0
            while True:
                behind = lag(settings, "ingress", "commands") + lag(settings, "ledger", "job-log")
                if first.proc:
                    peak_rss = max(peak_rss, tree_stats(first.proc.pid)[0])
                if behind == 0:
                    break
                time.sleep(2)
            applied_s = time.monotonic() - started
            time.sleep(5)  # the scheduler's heaps follow the committed state
            rss_mb = tree_stats(first.proc.pid)[0] if first.proc else float("nan")
            split = rss_split(first.proc.pid) if first.proc else (float("nan"),) * 2
        finally:
            first.kill()
        second = node(settings, "reg-2", logs, args.store, args.ledgers)
        takeover_started = time.monotonic()
        second.start()
        restored: list[tuple[str, str]] = []  # (records, seconds) of each ledger process
        ready_s = float("nan")
        caught_up: list[str] = []
        held: dict[str, str] = {}
        handed: list[tuple[str, str]] = []
        bounded = 0
        scheduler_s = float("nan")
        try:
            deadline = time.monotonic() + 1800
            while time.monotonic() < deadline:
                text = second.log.read_text(errors="replace")
                if len(restored) < args.ledgers:
                    restored = re.findall(r"restored from (\d+) state records in ([\d.]+) s", text)
                    if len(restored) >= args.ledgers:
                        ready_s = time.monotonic() - takeover_started
                caught_up = re.findall(r"caught up with partition \d+ in ([\d.]+) s", text)
                bounded = text.count("(at its time bound)")
                if len(caught_up) >= settings.partitions and scheduler_s != scheduler_s:
                    scheduler_s = time.monotonic() - takeover_started
                if len(restored) >= args.ledgers and scheduler_s == scheduler_s:
                    break
                time.sleep(0.5)
            second_rss = tree_stats(second.proc.pid)[0] if second.proc else float("nan")
            # Settled, as the first node's is taken a while after its last job: with
            # CRONLOG_MALLOC_TRIM_S set, a trim has come since the restore.
            time.sleep(10)
            second_settled = tree_stats(second.proc.pid)[0] if second.proc else float("nan")
            second_split = rss_split(second.proc.pid) if second.proc else (float("nan"),) * 2
            text = second.log.read_text(errors="replace")
            # What each partition's catch-up learnt (its last line), and what the node's
            # processes handed back to the OS once caught up (streams/lifecycle.py).
            held = dict(re.findall(r"caught up with partition (\d+) in .*?: (\d+) jobs", text))
            handed = re.findall(r"handed (\d+) MB of freed memory back in (\d+) ms", text)
        finally:
            second.stop()
        code, audit_text = audit(settings)
    report(
        "registry",
        {
            "jobs": jobs,
            "store": args.store,
            "ledgers": args.ledgers,
            "produce_s": produced_s,
            "registered_per_s": jobs / applied_s,
            "all_applied_s": applied_s,
            "node_rss_mb": rss_mb,
            "node_peak_rss_mb": peak_rss,
            # The main process (ingress, scheduler, dispatcher) and the ledger processes.
            "node_main_rss_mb": split[0],
            "node_ledgers_rss_mb": split[1],
            "takeover_restored_records": sum(int(n) for n, _ in restored),
            "takeover_restore_s": max((float(t) for _, t in restored), default=float("nan")),
            "takeover_ready_s": ready_s,
            # Until the scheduler caught up with every partition (its timers rebuilt).
            "takeover_scheduler_ready_s": scheduler_s,
            "scheduler_catch_up_s": max(map(float, caught_up), default=float("nan")),
            # Partitions whose catch-up ended at its bound (CATCH_UP_MAX_S) rather than at
            # the end of the topics: the rest of them learnt record by record after it.
            "scheduler_bounded_partitions": bounded,
            "takeover_scheduler_jobs": sum(map(int, held.values())),
            "takeover_trimmed_mb": sum(int(mb) for mb, _ in handed),
            "takeover_trim_ms": max((int(ms) for _, ms in handed), default=0),
            "takeover_node_rss_at_ready_mb": second_rss,
            "takeover_node_rss_mb": second_settled,
            "takeover_main_rss_mb": second_split[0],
            "takeover_ledgers_rss_mb": second_split[1],
            "audit": verdict(code),
        },
    )
    print(audit_text.strip())
    print(f"audit: {verdict(code)}")


if __name__ == "__main__":
    main()
