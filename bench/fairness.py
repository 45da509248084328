"""Owner fairness (issue 53 item 12): no owner's volume delays another owner's firings.

One node, two noop workers, the projector and the API, default options. Owner "quiet"
has 100 jobs `every 2s`; owner "noisy" has 20 hourly jobs and, through the API with 4
clients (within the API's per-token rate limit), in turn:

1. floods backfills of its jobs (each call 96 hourly runs of a range not backfilled
   yet) for `--flood-s`, then the measure goes on as long again while its backlog
   drains;
2. floods run-now requests for `--run-now-s`;
3. registers new jobs as fast as it may for `--register-s`, up to its `jobs` quota (the
   one option set: CRONLOG_OWNER_QUOTAS=noisy:jobs=<20 + --extra-jobs>, so the limit is
   met in seconds; the default is 10,000).

Per phase: the quiet owner's firings due in it, how many were created (their first
run-event) and how many on time (within 1 s of their time), their start lateness
p50/p99/max (the first attempt's start, as the audit measures it), and the noisy owner's
runs finished per second (its backlog draining at the rate the machine allows); the API's
answers (accepted, refused by a quota naming it, by the rate limit). At the end the noisy
jobs are deleted (their queued backfills go with them), and `cronlog audit` must be
clean. `python -m bench.fairness`; `--quick` for shorter phases.
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
from confluent_kafka import Consumer

from bench.common import audit, bench_settings, percentile, report, table, verdict
from schemas.codec import RUN_EVENTS, CodecError
from schemas.records import RunEvent
from streams.kafka import consumer_config
from streams.settings import Settings
from tests.support.isolation import create_database, drop_database, unique_name
from tests.support.nodes import CronlogProcess, Node, ProjectorProc, WorkerProc, send_commands
from tests.support.ports import free_port

QUIET_JOBS = 100
NOISY_JOBS = 20
EVERY_MS = 2000
HOUR_MS = 3_600_000
RANGE_HOURS = 96  # runs one backfill call asks for
NOISY_TOKEN = "tok-fair-noisy-0123456789abcdef"
QUIET_TOKEN = "tok-fair-quiet-0123456789abcdef"
ADMIN_TOKEN = "tok-fair-admin-0123456789abcdef"
ON_TIME_MS = 1000


@dataclass
class Tracker:
    """Follows run-events in a thread: the quiet owner's firings (created, started) and
    the noisy owner's runs finished."""

    settings: Settings
    created: dict[str, tuple[int, int]] = field(default_factory=dict)  # run -> (due, at)
    started: dict[str, int] = field(default_factory=dict)  # run -> first start
    noisy_done: list[tuple[int, str]] = field(default_factory=list)  # (at_ms, trigger)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        consumer = Consumer(
            consumer_config(
                self.settings,
                self.settings.group("bench-fairness"),
                **{
                    "auto.offset.reset": "earliest",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                },
            )
        )
        consumer.subscribe([self.settings.topic("run-events")])
        try:
            while not self.stop.is_set():
                for msg in consumer.consume(2000, timeout=0.2):
                    if msg.error() is not None or not msg.value():
                        continue
                    try:
                        event = RUN_EVENTS.decode(msg.value() or b"")
                    except CodecError:
                        continue
                    if not isinstance(event, RunEvent):
                        continue  # a job's transition
                    job_id = event.job_id
                    if job_id.startswith("quiet-") and event.trigger == "schedule":
                        if event.run_id not in self.created:
                            self.created[event.run_id] = (event.scheduled_ms, event.at_ms)
                        if event.state == "running" and event.attempt == 1:
                            self.started.setdefault(event.run_id, event.happened_ms)
                    elif job_id.startswith("noisy-") and event.state == "succeeded":
                        self.noisy_done.append((event.at_ms, event.trigger))
        finally:
            consumer.close()


@dataclass
class Answers:
    codes: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, answer: httpx.Response) -> float:
        """Count an answer; the seconds to wait before the next call."""
        if answer.status_code == 429:
            message = answer.json().get("error", {}).get("message", "")
            kind = message.split(":")[0] if message.startswith("quota") else "rate limit"
            key = f"429 {kind}"
            wait = min(float(answer.headers.get("retry-after", "1")), 1.0)
        elif answer.status_code < 300:
            key, wait = "accepted", 0.0
        else:
            key, wait = f"{answer.status_code}", 0.0
        with self.lock:
            self.codes[key] += 1
        return wait


def _flood(base: str, seconds: float, call: object, clients: int) -> Answers:
    answers = Answers()
    end = time.monotonic() + seconds
    counter = itertools.count()
    lock = threading.Lock()

    def client() -> None:
        with httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {NOISY_TOKEN}"}
        ) as http:
            while time.monotonic() < end:
                with lock:
                    n = next(counter)
                try:
                    wait = answers.add(call(http, n))  # type: ignore[operator]
                except httpx.HTTPError:
                    wait = 0.5
                    with answers.lock:
                        answers.codes["transport error"] += 1
                if wait:
                    time.sleep(wait)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _phase(tracker: Tracker, name: str, start_ms: int, end_ms: int) -> dict[str, object]:
    """The quiet owner's firings due in [start, end) and the noisy owner's runs finished."""
    first = -(-start_ms // EVERY_MS) * EVERY_MS
    due = QUIET_JOBS * len(range(first, end_ms, EVERY_MS))
    created = {r: v for r, v in list(tracker.created.items()) if start_ms <= v[0] < end_ms}
    on_time = sum(at - t <= ON_TIME_MS for t, at in created.values())
    late = [
        (tracker.started[r] - t) / 1000 for r, (t, _) in created.items() if r in tracker.started
    ]
    done = [at for at, _ in list(tracker.noisy_done) if start_ms <= at < end_ms]
    return {
        "phase": name,
        "quiet_due": due,
        "created": len(created),
        "on_time": on_time,
        "started": len(late),
        "p50_s": percentile(late, 0.5),
        "p99_s": percentile(late, 0.99),
        "max_s": max(late, default=float("nan")),
        "noisy_done_per_s": len(done) / ((end_ms - start_ms) / 1000),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="phases of 10, 20, 20, 10 and 10 s")
    parser.add_argument("--baseline-s", type=float, default=30.0)
    parser.add_argument("--flood-s", type=float, default=60.0)
    parser.add_argument("--run-now-s", type=float, default=30.0)
    parser.add_argument("--register-s", type=float, default=20.0)
    parser.add_argument(
        "--extra-jobs", type=int, default=60, help="noisy may register this many jobs beyond its 20"
    )
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--keep-logs", type=Path, default=None)
    args = parser.parse_args()
    if args.quick:
        args.baseline_s, args.flood_s, args.run_now_s, args.register_s = 10, 20, 10, 10
        args.extra_jobs = 20
    with bench_settings("fairness") as shared, tempfile.TemporaryDirectory() as tmp:
        # A database of its own: one database serves one deployment (topic prefix).
        name = unique_name("bench_fairness")
        url, kind = create_database(shared.database_url, name)
        settings = shared.with_(database_url=url)
        try:
            _run(args, settings, tmp)
        finally:
            drop_database(shared.database_url, name, kind)


def _run(args: argparse.Namespace, settings: Settings, tmp: str) -> None:
    logs = Path(tmp) if args.keep_logs is None else args.keep_logs
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {
        "CRONLOG_API_TOKENS": f"{NOISY_TOKEN}=noisy,{QUIET_TOKEN}=quiet",
        "CRONLOG_API_ADMIN_TOKENS": ADMIN_TOKEN,
        "CRONLOG_OWNER_QUOTAS": f";noisy:jobs={NOISY_JOBS + args.extra_jobs}",
    }
    node = Node(settings, "fair-node", logs).start()
    workers = [
        WorkerProc(settings, f"fw{i}", logs, cpu=1000, memory_mb=10**6) for i in range(args.workers)
    ]
    for worker in workers:
        worker.argv += ["--executor", "noop"]
        worker.start()
    projector = ProjectorProc(settings, logs / "projector.log").start()
    api = CronlogProcess(
        settings, "fair-api", logs, ["api", "--port", str(port), "--loglevel", "warning"], env
    ).start()
    base = f"http://127.0.0.1:{port}"
    tracker = Tracker(settings)
    follower = threading.Thread(target=tracker.run, daemon=True)
    follower.start()
    try:
        jobs: list[bytes | dict[str, object]] = [
            {
                "type": "job.upsert",
                "job_id": f"quiet-{i:03d}",
                "owner": "quiet",
                "schedule": {"every": "2s"},
                "command": ["true"],
            }
            for i in range(QUIET_JOBS)
        ]
        jobs += [
            {
                "type": "job.upsert",
                "job_id": f"noisy-{i:02d}",
                "owner": "noisy",
                "schedule": {"cron": "0 * * * *"},
                "command": ["true"],
            }
            for i in range(NOISY_JOBS)
        ]
        send_commands(settings, jobs)
        registered_ms = int(time.time() * 1000)
        newest = registered_ms // HOUR_MS * HOUR_MS - HOUR_MS  # before registration
        admin = httpx.Client(
            base_url=base, timeout=10, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if all(
                    admin.get(f"/jobs/noisy-{i:02d}").status_code == 200 for i in range(NOISY_JOBS)
                ):
                    break
            except httpx.TransportError:
                pass
            time.sleep(1)
        else:
            raise SystemExit("the API never showed the noisy jobs")

        def backfill(http: httpx.Client, n: int) -> httpx.Response:
            job, k = n % NOISY_JOBS, n // NOISY_JOBS
            to = newest - k * RANGE_HOURS * HOUR_MS
            body = {"from": _iso(to - (RANGE_HOURS - 1) * HOUR_MS), "to": _iso(to)}
            return http.post(f"/jobs/noisy-{job:02d}/backfill", json=body)

        def run_now(http: httpx.Client, n: int) -> httpx.Response:
            return http.post(f"/jobs/noisy-{n % NOISY_JOBS:02d}/run-now", json={})

        def register(http: httpx.Client, n: int) -> httpx.Response:
            body = {
                "job_id": f"noisy-x{n:05d}",
                "schedule": {"cron": "0 3 * * *"},
                "command": ["true"],
            }
            return http.post("/jobs", json=body)

        marks: list[tuple[str, int]] = []

        def mark(name: str) -> None:
            marks.append((name, int(time.time() * 1000)))

        time.sleep(5)  # the quiet jobs' first firings
        mark("baseline")
        time.sleep(args.baseline_s)
        mark("backfill flood")
        flood = _flood(base, args.flood_s, backfill, args.clients)
        mark("backlog draining")
        time.sleep(args.flood_s)
        mark("run-now flood")
        runs = _flood(base, args.run_now_s, run_now, args.clients)
        mark("jobs at the limit")
        regs = _flood(base, args.register_s, register, args.clients)
        mark("end")
        time.sleep(10)  # the firings due before the end: created and started
        rows = [
            _phase(tracker, name, start, end)
            for (name, start), (_, end) in itertools.pairwise(marks)
        ]
        after = [_phase(tracker, "after baseline", marks[1][1], marks[-1][1])]
        table("owner fairness: the quiet owner per phase", rows + after)
        backfill_done = [at for at, trigger in tracker.noisy_done if trigger == "backfill"]
        # Stop the noisy backlog: its jobs deleted, their queued backfills with them.
        deletes: list[bytes | dict[str, object]] = [
            {"type": "job.delete", "job_id": f"noisy-{i:02d}"} for i in range(NOISY_JOBS)
        ]
        send_commands(settings, deletes)
        time.sleep(15)
        code, audit_report = audit(settings)
        print(audit_report)
        whole = after[0]
        report(
            "fairness" + ("-quick" if args.quick else ""),
            {
                "quiet_jobs": QUIET_JOBS,
                "noisy_jobs": NOISY_JOBS,
                "workers": args.workers,
                "clients": args.clients,
                "flood_s": args.flood_s,
                "backfill_calls": dict(flood.codes),
                "backfill_runs_asked": flood.codes["accepted"] * RANGE_HOURS,
                "backfill_runs_finished": len(backfill_done),
                "run_now_calls": dict(runs.codes),
                "register_calls": dict(regs.codes),
                "quiet_due": whole["quiet_due"],
                "quiet_created": whole["created"],
                "quiet_created_on_time": whole["on_time"],
                "quiet_started": whole["started"],
                "quiet_start_lateness_p50_s": whole["p50_s"],
                "quiet_start_lateness_p99_s": whole["p99_s"],
                "quiet_start_lateness_max_s": whole["max_s"],
                "noisy_done_per_s": whole["noisy_done_per_s"],
                "phases": rows,
                "audit": verdict(code),
            },
        )
        if code != 0:
            raise SystemExit(f"the audit is not clean ({verdict(code)})")
    finally:
        tracker.stop.set()
        follower.join(10)
        api.stop()
        projector.stop()
        for worker in workers:
            worker.stop()
        node.stop()


if __name__ == "__main__":
    main()
