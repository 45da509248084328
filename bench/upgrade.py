"""A rolling upgrade under load: an older release's cluster replaced process by process.

`python -m bench.upgrade [--from REF] [--to REF] [--after-s 300] [--quick]`
(`make upgrade-test`). The two releases are built into venvs of their own
(bench/upgrade_build.py): `--from`, by default the parent of the newest commit that
changed a record schema (the newest release whose records are older than HEAD's), and
`--to`, by default HEAD (committed: the checkout's uncommitted edits are not in it).

On the shared broker under a private topic prefix, with a private database: the old
release's `topics create` and `db migrate`, two nodes, three workers, the projector and
the API, under load (short jobs every 1 s and 2 s, jobs of 10-20 s every 30 s, run-now
through the API every few seconds). Then each process is stopped and started again from
the new release, one at a time, `--step-s` apart, in the order `--order` names: `auto` (the
default: what CHANGELOG.md asks for the record versions the new release adds, readers
before writers), `brief` (the issue's: nodes, workers, then the new `db migrate`,
projector, API) or `readers-first` (the new `db migrate`, projector, API, nodes,
workers). The new release's `topics create` runs before its first process. Then
`--after-s` more under load.

Checks: every firing of the periodic jobs has exactly one run and every acknowledged
run-now its run (tests/support/firings.py), every run final after the jobs are paused,
`cronlog audit` clean, no process died, nothing dead-lettered (the DLQ topics, the
projector's table: where an old reader puts a record version it does not know). Start
lateness p99 over the whole upgrade. The last line printed is one JSON object; the exit
status is 1 unless every check passed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition

from bench.common import audit, report, verdict
from bench.upgrade_build import Release, build, default_from
from streams.kafka import consumer_config
from streams.settings import Settings
from tests.support.firings import (
    Verdict,
    check_firings,
    latest_starts,
    settled,
    start_lateness,
)
from tests.support.isolation import create_database, delete_topics_with_prefix, drop_database
from tests.support.nodes import (
    CronlogProcess,
    EventReader,
    Node,
    ProjectorProc,
    WorkerProc,
    end_offsets,
    env_for,
    job,
    send_commands,
)
from tests.support.ports import free_port
from tests.support.services import real_services

TOKEN = "upgrade-owner-token"
OWNER = "t"
# What an old process logs when it meets a record it cannot read, or fails at it.
REFUSED = re.compile(r"dead.letter|undecodable|CodecError|unknown schema|Traceback", re.I)


@dataclass(frozen=True)
class Load:
    """The jobs: periodic ones checked firing by firing, long ones by their runs."""

    every_1s: tuple[str, ...] = tuple(f"up-1s-{i}" for i in range(8))
    every_2s: tuple[str, ...] = tuple(f"up-2s-{i}" for i in range(4))
    long: tuple[tuple[str, int], ...] = (("up-long-10", 10), ("up-long-15", 15), ("up-long-20", 20))

    @property
    def all_ids(self) -> list[str]:
        return [*self.every_1s, *self.every_2s, *(j for j, _ in self.long)]

    def commands(self) -> list[bytes | dict[str, object]]:
        short = {"idempotent": True, "retry": {"max_attempts": 5, "backoff_s": 0}}
        jobs: list[bytes | dict[str, object]] = [
            job(j, ["true"], schedule={"every": "1s"}, **short) for j in self.every_1s
        ]
        jobs += [job(j, ["true"], schedule={"every": "2s"}, **short) for j in self.every_2s]
        jobs += [
            job(
                j,
                ["sleep", str(seconds)],
                schedule={"every": "30s"},
                idempotent=True,
                retry={"max_attempts": 3, "backoff_s": 1},
            )
            for j, seconds in self.long
        ]
        return jobs


@dataclass
class Cluster:
    """The processes by role, each running the release it was started from."""

    settings: Settings
    logs: Path
    api_port: int
    nodes: list[CronlogProcess] = field(default_factory=list)
    workers: list[CronlogProcess] = field(default_factory=list)
    projector: list[CronlogProcess] = field(default_factory=list)
    api: list[CronlogProcess] = field(default_factory=list)
    release_of: dict[str, str] = field(default_factory=dict)  # process name -> commit
    died: list[str] = field(default_factory=list)

    @property
    def processes(self) -> list[CronlogProcess]:
        return [*self.nodes, *self.workers, *self.projector, *self.api]

    def make(self, role: str, i: int, release: Release) -> CronlogProcess:
        """Process `i` of `role`, run by `release`; its log names the release, its state
        (a worker's journal) is the same for every release."""
        logs = self.logs / release.short
        logs.mkdir(parents=True, exist_ok=True)
        state = {"CRONLOG_STATE_DIR": str(self.logs / "state")}
        proc: CronlogProcess
        if role == "nodes":
            proc = Node(self.settings, f"up-n{i}", logs)
        elif role == "workers":
            proc = WorkerProc(self.settings, f"up-w{i}", logs, cpu=8, extra_env=state)
        elif role == "projector":
            proc = ProjectorProc(self.settings, logs / "up-projector.log")
        else:
            env = {"CRONLOG_API_TOKENS": f"{TOKEN}={OWNER}"}
            args = ["api", "--port", str(self.api_port), "--loglevel", "warning"]
            proc = CronlogProcess(self.settings, "up-api", logs, args, env)
        # The release's own entry point in place of `python -m` from the checkout.
        proc.argv = [str(release.cronlog), *proc.args]
        self.release_of[proc.name] = release.commit
        return proc

    def start(self, release: Release) -> None:
        self.nodes = [self.make("nodes", i, release).start() for i in (1, 2)]
        self.workers = [self.make("workers", i, release).start() for i in (1, 2, 3)]
        self.projector = [self.make("projector", 1, release).start()]
        self.api = [self.make("api", 1, release).start()]

    def replace(self, role: str, i: int, release: Release) -> str:
        group: list[CronlogProcess] = getattr(self, role)
        old = group[i]
        old.stop()
        group[i] = self.make(role, i + 1, release).start()
        return f"{old.name} -> {release.short}"

    def supervise(self) -> None:
        """Start again whatever died (what systemd would do), noting it: a death is a
        finding of the upgrade."""
        for proc in self.processes:
            if not proc.alive:
                commit = self.release_of[proc.name][:7]
                code = proc.proc.returncode if proc.proc else None
                self.died.append(f"{proc.name}@{commit} exited {code}: {proc.last_words(5)}")
                print(f"{time.strftime('%H:%M:%S')} {proc.name}@{commit} died", flush=True)
                proc.start()

    def stop(self) -> None:
        for proc in self.processes:
            proc.stop()


class RunNow:
    """Run-now through the API; a request counts once the API acknowledged it (202),
    and one refused or unanswered (the API restarting) is sent again, same request id."""

    def __init__(self, port: int, targets: tuple[str, ...]) -> None:
        self.client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        self.targets = targets
        self.acknowledged: list[str] = []
        self.pending: list[tuple[str, str]] = []
        self.n = 0

    def send(self) -> None:
        self.n += 1
        self.pending.append((self.targets[self.n % len(self.targets)], f"r{self.n}"))
        still = []
        for job_id, request in self.pending:
            try:
                answer = self.client.post(f"/jobs/{job_id}/run-now", json={"request_id": request})
                ok = answer.status_code in (200, 201, 202)
            except httpx.HTTPError:
                ok = False
            if ok:
                self.acknowledged.append(f"{job_id}@manual:{request}")
            else:
                still.append((job_id, request))
        self.pending = still

    def close(self) -> None:
        self.client.close()


def cli(release: Release, settings: Settings, *args: str) -> None:
    """A one-off `cronlog` command of `release` (topics create, db migrate)."""
    subprocess.run(
        [str(release.cronlog), *args],
        env=env_for(settings),
        check=True,
        capture_output=True,
        timeout=180,
    )


Step = tuple[str, int]  # (role, index) or ("migrate", 0)
NODES: list[Step] = [("nodes", 0), ("nodes", 1)]
WORKERS: list[Step] = [("workers", 0), ("workers", 1), ("workers", 2)]
# The records whose writers include the API's worker gateway, and the one the workers
# read from the nodes: they decide where the API and the workers go (CHANGELOG.md).
API_WRITES = {"job_log", "heartbeat"}
NODES_WRITE_FOR_WORKERS = {"worker_inbox"}


def auto_order(changed: set[str]) -> list[Step]:
    """The order CHANGELOG.md asks for the records that changed: the migration and the
    projector (a reader only) first; the API before the nodes unless it writes a changed
    record; workers before the nodes only when the nodes write them a new version and
    they write none."""
    api_early = not changed & API_WRITES
    workers_early = bool(changed & NODES_WRITE_FOR_WORKERS) and not changed & API_WRITES
    steps: list[Step] = [("migrate", 0), ("projector", 0)]
    steps += [("api", 0)] if api_early else []
    steps += [*WORKERS, *NODES] if workers_early else [*NODES, *WORKERS]
    steps += [] if api_early else [("api", 0)]
    return steps


ORDERS: dict[str, list[Step]] = {
    # The order: nodes, workers, then the new migration, projector and API.
    "brief": [*NODES, *WORKERS, ("migrate", 0), ("projector", 0), ("api", 0)],
    "readers-first": [("migrate", 0), ("projector", 0), ("api", 0), *NODES, *WORKERS],
}


def steps_for(order: str, old: Release, new: Release) -> list[Step]:
    if order != "auto":
        return ORDERS[order]
    return auto_order({name for name, _ in new.records() - old.records()})


@dataclass(frozen=True)
class Options:
    old: Release
    new: Release
    order: str
    before_s: float
    step_s: float
    after_s: float


def upgrade(settings: Settings, logs: Path, opts: Options) -> dict[str, object]:
    load = Load()
    cluster = Cluster(settings, logs, free_port())
    events = EventReader(settings, "upgrade-check")
    run_now = RunNow(cluster.api_port, load.every_2s)
    marks: dict[str, int] = {}
    done: list[str] = []

    def now_ms() -> int:
        return int(time.time() * 1000)

    def wait(seconds: float) -> None:
        """Load and watch for `seconds`: a run-now every few seconds, deaths noted."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            cluster.supervise()
            run_now.send()
            events.poll_for(min(4.0, max(0.0, end - time.monotonic())))

    cluster.start(opts.old)
    try:
        send_commands(settings, load.commands())
        events.wait_until(
            lambda: (
                {e.job_id for e, _ in events.run_events() if e.state == "succeeded"}
                >= set(load.every_1s) | set(load.every_2s)
            ),
            300,
            "every short job's first run",
        )
        marks["warm_ms"] = now_ms()
        print(f"{time.strftime('%H:%M:%S')} old cluster up, load running", flush=True)
        wait(opts.before_s)
        marks["upgrade_start_ms"] = now_ms()
        cli(opts.new, settings, "topics", "create")
        for role, i in steps_for(opts.order, opts.old, opts.new):
            if role == "migrate":
                cli(opts.new, settings, "db", "migrate")
                what = f"db migrate -> {opts.new.short}"
            else:
                what = cluster.replace(role, i, opts.new)
            done.append(what)
            print(f"{time.strftime('%H:%M:%S')} {what}", flush=True)
            wait(opts.step_s)
        marks["upgrade_end_ms"] = now_ms()
        wait(opts.after_s)
        marks["after_end_ms"] = now_ms()
        cluster.supervise()
        send_commands(settings, [{"type": "job.pause", "job_id": j} for j in load.all_ids])
        events.wait_until(
            lambda: (
                {e.job_id for e in events.job_events() if e.kind == "paused"} >= set(load.all_ids)
            ),
            300,
            "every job paused",
        )
        try:
            events.wait_until(lambda: settled(events), 300, "every run final")
        except AssertionError as exc:
            print(f"warning: {exc}", flush=True)
        events.poll_for(3)
    finally:
        run_now.close()
        events.close()
        cluster.stop()
    return figures(settings, events, load, run_now, cluster, marks, done, opts)


def figures(
    settings: Settings,
    events: EventReader,
    load: Load,
    run_now: RunNow,
    cluster: Cluster,
    marks: dict[str, int],
    done: list[str],
    opts: Options,
) -> dict[str, object]:
    checks: list[Verdict] = [
        check_firings(events, list(load.every_1s), 1000, run_now.acknowledged),
        check_firings(events, list(load.every_2s), 2000),
        check_firings(events, [j for j, _ in load.long], 30_000, require_success=False),
    ]
    code, audit_text = audit(settings)
    if code != 0:
        print(audit_text)
    during = start_lateness(events, marks["upgrade_start_ms"], marks["upgrade_end_ms"])
    # A run whose first attempt was lost with a restarted worker starts on a retry: its
    # lateness is that start's, counted here, not left out.
    during_any = start_lateness(
        events, marks["upgrade_start_ms"], marks["upgrade_end_ms"], any_attempt=True
    )
    latest = latest_starts(events, marks["upgrade_start_ms"], marks["after_end_ms"])
    after = start_lateness(events, marks["upgrade_end_ms"], marks["after_end_ms"])
    before = start_lateness(
        events, marks["upgrade_start_ms"] - int(opts.before_s * 1000), marks["upgrade_start_ms"]
    )
    warm_up = skipped_in_warm_up(events, checks, marks["warm_ms"])
    attempts_failed = sum(
        1
        for e, _ in events.run_events()
        if e.job_id in {j for j, _ in load.long} and e.state in ("failed", "retrying")
    )
    refused = refusals(cluster.logs)
    dead = dead_letters(settings)
    for check in checks:
        examples = check.summary()["examples"]
        if check.violations:
            print("examples:", examples)
    violations = sum(c.violations for c in checks)
    passed = (
        violations == 0
        and code == 0
        and not cluster.died
        and not any(dead.values())
        and not run_now.pending
    )
    return {
        "passed": passed,
        "from": opts.old.commit[:12],
        "from_version": opts.old.version,
        "to": opts.new.commit[:12],
        "to_version": opts.new.version,
        "order": opts.order,
        "records_new": sorted(f"{n} v{v}" for n, v in opts.new.records() - opts.old.records()),
        "steps": done,
        "firings_checked": sum(c.firings_checked for c in checks),
        "run_now_acknowledged": len(run_now.acknowledged),
        "run_now_unacknowledged": len(run_now.pending),
        "violations": violations,
        "duplicates": sum(len(c.duplicates) for c in checks),
        "missed": sum(len(c.missed) for c in checks),
        "not_final": sum(len(c.not_final) for c in checks),
        "lost_commands": sum(len(c.lost_commands) for c in checks),
        "not_succeeded": sum(len(c.not_succeeded) for c in checks),
        "skipped_before_the_cluster_was_up": warm_up,
        "long_attempts_failed_or_retried": attempts_failed,
        "audit": verdict(code),
        "p99_s": during_any.p99_s,
        "during_upgrade": str(during_any),
        "during_upgrade_first_attempts": str(during),
        "before_upgrade": str(before),
        "after_upgrade": str(after),
        "latest_starts": [f"{run_id} {late:.2f} s" for late, run_id in latest],
        "processes_died": len(cluster.died),
        "deaths": cluster.died[:5],
        "refusals_logged": refused,
        "dead_letters": dead,
        # The machine is shared: its load tells how far the lateness is this run's own.
        "load_average_1m_at_end": os.getloadavg()[0],
        "step_s": opts.step_s,
        "after_s": opts.after_s,
    }


def dlq_records(settings: Settings, topic: str) -> list[str]:
    """The reasons of the records on a DLQ topic (its end offsets count transaction
    markers too: the records are read)."""
    ends = end_offsets(settings, topic)
    consumer = Consumer(consumer_config(settings, None, **{"enable.auto.commit": False}))
    name = settings.topic(topic)
    consumer.assign([TopicPartition(name, p, 0) for p, end in ends.items() if end > 0])
    reasons: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while any(ends.values()) and time.monotonic() < deadline:
            msgs = consumer.consume(500, timeout=1)
            if not msgs:
                break
            for msg in msgs:
                if msg.error() is None and msg.value():
                    envelope = orjson.loads(msg.value() or b"{}")
                    reasons.append(str(envelope.get("reason", "")))
    finally:
        consumer.close()
    return reasons


def skipped_in_warm_up(events: EventReader, checks: list[Verdict], warm_ms: int) -> int:
    """Drop from the checks the runs due before the old cluster first ran every short
    job: on a loaded machine it can take a minute to start, and the firings due meanwhile
    are skipped by their misfire policy, as they should. The upgrade is judged from
    then on; how many were dropped is reported."""
    scheduled = {e.run_id: e.scheduled_ms for e, _ in events.run_events()}
    dropped = 0
    for check in checks:
        early = [r for r in check.not_succeeded if scheduled.get(r, warm_ms) < warm_ms]
        for run_id in early:
            if check.not_succeeded[run_id].startswith("skipped: misfire"):
                del check.not_succeeded[run_id]
                dropped += 1
    return dropped


def dead_letters(settings: Settings) -> dict[str, object]:
    """What was dead-lettered: records on the DLQ topics, and the records the projector
    could not project (kept in its table with the reason, and not logged)."""
    found: dict[str, object] = {}
    for topic in ("commands.dlq", "notifications.dlq"):
        records = dlq_records(settings, topic)
        if records:
            found[topic] = f"{len(records)}, e.g. {records[0][:300]}"
    with psycopg.connect(settings.database_url) as conn:
        rows = conn.execute(
            "SELECT topic, count(*), min(reason) FROM projector_dead_letters GROUP BY topic"
        ).fetchall()
    for topic, count, reason in rows:
        found[f"projector: {topic}"] = f"{count}, e.g. {reason[:300]}"
    return found


def refusals(logs: Path) -> dict[str, int]:
    """Per log (release folder/process), the lines that tell of a record refused or a
    failure: an old reader meeting a record version it does not know shows here."""
    found: dict[str, int] = {}
    for path in sorted(logs.glob("*/*.log")):
        count = sum(
            1 for line in path.read_text(errors="replace").splitlines() if REFUSED.search(line)
        )
        if count:
            found[f"{path.parent.name}/{path.stem}"] = count
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--from", dest="from_ref", default=None, help="the old release")
    parser.add_argument("--to", dest="to_ref", default="HEAD", help="the new release")
    parser.add_argument("--order", choices=["auto", *sorted(ORDERS)], default="auto")
    parser.add_argument("--before-s", type=float, default=60.0)
    parser.add_argument("--step-s", type=float, default=30.0)
    parser.add_argument("--after-s", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="shorter: 20 s steps, 60 s after")
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args()
    if args.quick:
        args.before_s, args.step_s, args.after_s = 30.0, 15.0, 60.0
    with tempfile.TemporaryDirectory() as tmp:
        logs = args.logs or Path(tmp) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        build_log = logs / "build.log"
        old = build(args.from_ref or default_from(), build_log)
        new = build(args.to_ref, build_log)
        print(f"upgrade: {old.version} ({old.short}) -> {new.version} ({new.short})", flush=True)
        opts = Options(old, new, args.order, args.before_s, args.step_s, args.after_s)
        name = f"upgrade_{uuid.uuid4().hex[:6]}"
        with real_services() as services:
            database_url, kind = create_database(services.database_url, name)
            settings = Settings(
                kafka=services.kafka,
                database_url=database_url,
                topic_prefix=f"bench.{name}.",
                partitions=6,
            )
            try:
                cli(old, settings, "topics", "create")
                cli(old, settings, "db", "migrate")
                found = upgrade(settings, logs, opts)
            finally:
                drop_database(services.database_url, name, kind)
                if os.environ.get("CRONLOG_BENCH_KEEP_TOPICS") == "1":  # to read them after
                    print(f"topics kept: {settings.topic_prefix}*", flush=True)
                else:
                    delete_topics_with_prefix(settings, settings.topic_prefix)
    report("upgrade", found)
    print(json.dumps(found), flush=True)
    if not found["passed"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
