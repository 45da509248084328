"""Soak: a million firings of a real fleet's load under a nemesis, then every check
(issue 54). `python -m bench.soak` (`make soak`); `--quick`: about 50,000 firings.

The world and the nemesis are in bench/soak_world.py, the load in bench/soak_load.py,
the pure arithmetic (prices per fault kind, the jobs' own marks, the verdict) in
bench/soak_prices.py. It runs until `--firings` firings have come due, printing a
progress line about every 30 s (firings due, runs final, the current fault, violations
so far), a fault every 20-60 s (10-30 s with --quick). Then it stops the nemesis and the
API traffic, pauses every job, waits until every run is final and checks, on everything
that came due: no duplicate run, no missed firing, no attempt executed twice (the jobs'
own marks), no overlap of a `forbid` job, no long job killed by a fault that does not
hit its worker, no run left non-final, no acknowledged command lost (registrations,
pauses, run-now, the API's pause/resume/edit), the audit clean, the projection's runs
per state equal to the topic's. Then the price of each fault kind, and, last, one JSON
line: {"firings", "violations", "faults": {kind: price}, "audit"}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest

from bench.chaos import _migrate
from bench.common import audit, report, table, verdict
from bench.soak_load import ApiTraffic, Load, Traffic, make_load
from bench.soak_prices import (
    Fault,
    RunFacts,
    executed_twice,
    final_line,
    killed_long_runs,
    overlaps,
    parse_marks,
    price_table,
    run_facts,
    tally,
)
from bench.soak_world import API_TOKEN, FATAL, Nemesis, World, drop_postgres, private_postgres
from schemas.records import FINAL_STATES, JobEvent, RunEvent
from streams.core.schedule import fires_between
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.cluster import private_cluster
from tests.support.netns import available, namespace
from tests.support.nodes import EventReader, send_commands
from tests.support.skew import skew_env

ROOT = Path(__file__).resolve().parents[1]
PROGRESS_S = 30.0


class Tracker:
    """What run-events said so far, folded as they are read: each run's first and last
    event, the runs of each (job, scheduled time)."""

    def __init__(self, events: EventReader):
        self.events = events
        self.read = 0
        self.first: dict[str, RunEvent] = {}
        self.last: dict[str, RunEvent] = {}
        self.by_time: defaultdict[tuple[str, int], set[str]] = defaultdict(set)

    def fold(self) -> None:
        seen = self.events.seen
        for s in seen[self.read :]:
            e = s.event
            if isinstance(e, RunEvent):
                if e.run_id not in self.first:
                    self.first[e.run_id] = e
                    if e.trigger != "manual":
                        self.by_time[(e.job_id, e.scheduled_ms)].add(e.run_id)
                self.last[e.run_id] = e
        self.read = len(seen)

    def due(self, now_ms: int) -> int:
        return sum(
            1 for e in self.first.values() if e.trigger != "manual" and e.scheduled_ms <= now_ms
        )

    def final(self) -> int:
        return sum(1 for e in self.last.values() if e.state in FINAL_STATES)

    def duplicates(self) -> list[str]:
        return [f"{j}@{t}: {sorted(ids)}" for (j, t), ids in self.by_time.items() if len(ids) > 1]


class Soak:
    def __init__(self, world: World, load: Load, seed: int, quick: bool, target: int):
        self.world = world
        self.load = load
        self.rng = random.Random(seed)
        self.quick = quick
        self.target = target
        self.events = EventReader(world.settings, "soak-check")
        self.tracker = Tracker(self.events)
        self.nemesis = Nemesis(world, random.Random(seed + 1), quick)
        self.printed = time.monotonic()
        self.started = time.monotonic()
        self.restarted: Counter[str] = Counter()

    # -- waiting, with progress ---------------------------------------------------------
    def poll(self, seconds: float) -> None:
        """Read run-events for `seconds`, printing progress every PROGRESS_S."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            self.events.poll_for(min(left, 1.0))
            if time.monotonic() - self.printed >= PROGRESS_S:
                self.progress()

    def calm(self, seconds: float) -> None:
        """Wait between faults: whatever died is restarted, as a supervisor would."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            for name in self.world.supervise():
                self.restarted[name] += 1
            self.poll(min(left, 2.0))

    def progress(self) -> None:
        self.printed = time.monotonic()
        self.tracker.fold()
        now_ms = int(time.time() * 1000)
        print(
            f"{time.strftime('%H:%M:%S')} +{time.monotonic() - self.started:.0f}s "
            f"due {self.tracker.due(now_ms)} final {self.tracker.final()} "
            f"fault: {self.nemesis.current} "
            f"violations so far: {len(self.tracker.duplicates())} duplicate runs",
            flush=True,
        )

    # -- the run --------------------------------------------------------------------------
    def run(self) -> tuple[int, Traffic]:
        settings = self.world.settings
        send_commands(settings, list(self.load.commands))
        self.events.wait_registered(self.load.all_jobs, 300)
        traffic = ApiTraffic(self.world.api_url, API_TOKEN, self.load, self.rng.randrange(1 << 30))
        traffic.start()
        gap = (10.0, 30.0) if self.quick else (20.0, 60.0)
        # One worker lost for good per hour; in --quick once, a third of the way in.
        lose_every_s = None if self.quick else 3600.0
        lost_once = False
        last_loss = time.monotonic()
        try:
            while True:
                self.calm(self.rng.uniform(*gap))
                self.tracker.fold()
                due = self.tracker.due(int(time.time() * 1000))
                if due >= self.target:
                    break
                if (self.quick and not lost_once and due >= self.target / 3) or (
                    lose_every_s is not None and time.monotonic() - last_loss >= lose_every_s
                ):
                    lost_once, last_loss = True, time.monotonic()
                    self.nemesis.worker_lost(self.poll)
                else:
                    self.inject(self.rng.choice(self.nemesis.kinds))
        finally:
            done = traffic.stop()
        self.calm(10)
        return due, done

    def inject(self, kind: str) -> None:
        """One fault; a kind that fails to stage here is reported and not tried again
        (its own clean-up has run: every fault undoes itself in a `finally`)."""
        try:
            self.nemesis.inject(kind, self.poll)
        except Exception as exc:  # noqa: BLE001 - the soak goes on without that kind
            print(f"fault {kind} failed to stage, left out from now: {exc!r}", flush=True)
            self.nemesis.unavailable[kind] = f"failed to stage: {exc!r}"[:200]
            self.nemesis.kinds.remove(kind)
            self.nemesis.current = "none"

    def end(self) -> int:
        """Pause every job (acknowledged by the broker), wait until every run is final;
        the time of the pause (ms)."""
        paused_ms = int(time.time() * 1000)
        jobs = self.load.all_jobs
        send_commands(self.world.settings, [{"type": "job.pause", "job_id": j} for j in jobs])

        def all_paused() -> bool:
            return {e.job_id for e in self.events.job_events() if e.kind == "paused"} >= set(jobs)

        self.events.wait_until(all_paused, 300, "every job paused")

        def settled() -> bool:
            for name in self.world.supervise():
                self.restarted[name] += 1
            if time.monotonic() - self.printed >= PROGRESS_S:
                self.progress()
            self.tracker.fold()
            return all(e.state in FINAL_STATES for e in self.tracker.last.values())

        try:
            self.events.wait_until(settled, 1800, "every run final")
            self.events.settle(300)
        except AssertionError as exc:
            print(f"warning: {exc}", flush=True)
        self.tracker.fold()
        return paused_ms


def check(soak: Soak, traffic: Traffic, marks: Path) -> tuple[dict[str, list[str]], list[RunFacts]]:
    """Every check on what came due: violations by check."""
    tracker, load = soak.tracker, soak.load
    job_events = soak.events.job_events()
    registered: dict[str, JobEvent] = {}
    paused_at: dict[str, int] = {}
    for e in job_events:
        if e.kind == "upserted":
            registered.setdefault(e.job_id, e)
        elif e.kind == "paused":
            paused_at[e.job_id] = e.at_ms  # the last pause: the final one
    lost = [f"upsert {j}" for j in load.all_jobs if j not in registered]
    lost += [f"pause {j}" for j in load.all_jobs if j not in paused_at]
    missed = []
    for job_id in load.scheduled:
        first = registered.get(job_id)
        if first is None or first.spec is None or job_id not in paused_at:
            continue
        for t in fires_between(first.spec.schedule, first.at_ms, paused_at[job_id], first.spec.dst):
            if not tracker.by_time.get((job_id, t)):
                missed.append(f"{job_id}@{t}")
    lost += [f"run-now {r}" for r in traffic.run_now if r not in tracker.first]
    lost += _ctl_lost(job_events, traffic)
    not_final = [f"{r}: {e.state}" for r, e in tracker.last.items() if e.state not in FINAL_STATES]
    all_marks = [
        m
        for f in sorted(marks.iterdir())
        for m in parse_marks(f.name, f.read_text(errors="replace"))
    ]
    rows = [
        (e.run_id, e.job_id, e.trigger, e.scheduled_ms, e.state, e.attempt, e.happened_ms,
         e.worker_id, e.reason)
        for e, _ in soak.events.run_events()
    ]  # fmt: skip
    facts = run_facts(rows)
    ends = {r: e.happened_ms for r, e in tracker.last.items() if e.state in FINAL_STATES}
    long_runs = [f for f in facts if f.job_id in set(load.long)]
    checks = {
        "duplicate_runs": tracker.duplicates(),
        "missed_firings": missed,
        "executed_twice": executed_twice(all_marks),
        "forbidden_overlaps": overlaps(all_marks, set(load.long)),
        "long_jobs_killed": killed_long_runs(long_runs, ends, soak.nemesis.faults, FATAL),
        "not_final": not_final,
        "acknowledged_commands_lost": lost,
        "projection_differs": _projection(soak),
    }
    return checks, facts


def _ctl_lost(job_events: list[JobEvent], traffic: Traffic) -> list[str]:
    """The API's pause/resume/edit of each `ctl-*` job: its last acknowledged pause or
    resume is its state before the final pause, its last acknowledged edit its env (a job
    with an unanswered command is not judged: that command may have applied)."""
    lost = []
    for job_id, ops in traffic.acked.items():
        if job_id in traffic.unsure:
            continue
        # Before the final pause-all (sent after the traffic stopped): its last pause or
        # resume event at or after the last acknowledged one was sent.
        switches = [(op, at) for op, _, at in ops if op in ("pause", "resume")]
        events = [e for e in job_events if e.job_id == job_id]
        if switches:
            op, sent = switches[-1]
            want = "paused" if op == "pause" else "resumed"
            seen = [
                e.kind for e in events if e.kind in ("paused", "resumed") and e.at_ms >= sent - 5000
            ]
            if want not in seen:
                lost.append(f"{op} {job_id} sent at {sent}")
        edits = [value for op, value, _ in ops if op == "edit"]
        if edits:
            specs = [e.spec for e in events if e.kind == "upserted" and e.spec is not None]
            env = dict(specs[-1].env) if specs else {}
            if env.get("EDIT") != edits[-1]:
                lost.append(f"edit {job_id} EDIT={edits[-1]} (found {env.get('EDIT')})")
    return lost


def _projection(soak: Soak, timeout_s: float = 180) -> list[str]:
    """The projection's runs per state against the topic's (the last state of each run),
    given the projector time to catch up."""
    want: Counter[str] = Counter(e.state for e in soak.tracker.last.values())
    deadline = time.monotonic() + timeout_s
    found: Counter[str] = Counter()
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(soak.world.settings.database_url, connect_timeout=5) as conn:
                found = Counter(
                    dict(conn.execute("SELECT state, count(*) FROM runs GROUP BY state").fetchall())
                )
        except psycopg.Error:
            pass
        if found == want:
            return []
        soak.world.supervise()
        time.sleep(2)
    return [
        f"{state}: topic {want[state]}, projection {found[state]}"
        for state in sorted(want | found)
        if want[state] != found[state]
    ]


def _skew(where: Path) -> dict[str, str] | None:
    """libfaketime's environment with the shim (tests/support/skew.py), None where the
    machine lacks it."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        env = skew_env(where)("+0")
    except pytest.skip.Exception as exc:
        print(f"clock faults unavailable: {exc}", flush=True)
        return None
    env.pop("FAKETIME")
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--firings", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="about 50,000 firings")
    parser.add_argument("--jobs", type=int, default=200, help="short `sh` jobs (every 1-5 s)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--logs", type=Path, help="keep the processes' logs here")
    args = parser.parse_args()
    why = available()
    if why is not None:
        raise SystemExit(f"soak: {why} (the network faults need namespaces)")
    target = 50_000 if args.quick else args.firings
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    print(
        f"soak: until {target} firings have come due, {args.jobs} short jobs, seed {seed}",
        flush=True,
    )
    (ROOT / ".state").mkdir(exist_ok=True)
    # Not under /tmp: the jobs' sandbox has a private /tmp, and they write their marks here.
    state = Path(tempfile.mkdtemp(prefix="soak-", dir=ROOT / ".state"))
    os.chmod(state, 0o755)
    marks = state / "marks"
    marks.mkdir()
    logs = args.logs or state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        figures, line = _soak(state, marks, logs, target, seed, args.jobs, args.quick)
    finally:
        shutil.rmtree(state, ignore_errors=True)  # with the logs, unless --logs put them apart
    report("soak", figures)
    print(json.dumps(line), flush=True)
    if line["violations"] != 0 or line["audit"] != "clean":
        raise SystemExit(1)


def _soak(
    state: Path, marks: Path, logs: Path, target: int, seed: int, short_jobs: int, quick: bool
) -> tuple[dict[str, object], dict[str, object]]:
    with ExitStack() as stack:
        ns_worker = stack.enter_context(namespace("cl-soak-w", 21))
        ns_node = stack.enter_context(namespace("cl-soak-n", 22))
        cluster = stack.enter_context(private_cluster(state, 3, ns_worker.host_ip))
        postgres = private_postgres(state / "pg")
        stack.callback(drop_postgres, postgres)
        settings = Settings(
            kafka=cluster.bootstrap, database_url=postgres.database_url, topic_prefix="soak."
        )
        ensure_topics(settings)
        _migrate(settings)
        world = World(
            settings,
            cluster,
            postgres,
            ns_worker,
            ns_node,
            logs,
            state / "clock",
            _skew(state / "skew"),
        )
        load = make_load(random.Random(seed), short_jobs, marks)
        world.start()
        stack.callback(world.stop)
        soak = Soak(world, load, seed, quick, target)
        stack.callback(soak.events.close)
        for kind, why in soak.nemesis.unavailable.items():
            print(f"fault {kind} unavailable here: {why}", flush=True)
        started = time.monotonic()
        _, traffic = soak.run()
        soak.end()
        checks, facts = check(soak, traffic, marks)
        code, audit_text = audit(settings)
        if code != 0:
            print(audit_text, flush=True)
        violations, counts, examples = tally(checks)
        prices = price_table(soak.nemesis.faults, facts)
        table("price of each fault kind", [{"kind": k, **p.as_json()} for k, p in prices.items()])
        firings = soak.tracker.due(int(time.time() * 1000))
        figures: dict[str, object] = {
            "seed": seed,
            "firings": firings,
            "runs_final": soak.tracker.final(),
            "minutes": round((time.monotonic() - started) / 60, 1),
            "faults": len(soak.nemesis.faults),
            "faults_by_kind": dict(Counter(f.kind for f in soak.nemesis.faults)),
            "unavailable": soak.nemesis.unavailable,
            "restarted_after_dying": dict(soak.restarted),
            "manual_runs_checked": len(traffic.run_now),
            "api_calls_refused": traffic.refused,
            **{f"checked_{k}": v for k, v in counts.items()},
            "violations": violations,
            "examples": examples,
            "audit": verdict(code),
            "fault_log": [_fault_row(f) for f in soak.nemesis.faults],
        }
        return figures, final_line(firings, violations, prices, verdict(code))
    raise AssertionError("unreachable")  # ExitStack does not swallow exceptions


def _fault_row(f: Fault) -> str:
    return f"{f.start_ms}-{f.end_ms} {f.kind}: {f.what}"


if __name__ == "__main__":
    main()
