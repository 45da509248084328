"""A deterministic simulation of the ledger in a hostile world (seeded, pure).

Actors: an on-time node that goes down now and then (takeovers, misfires); a
zombie node replaying stale proposals; a timer proposing deadlines; workers that claim
(sometimes two for one dispatch), start at the run's start time (not before), finish,
fail, die silently after the start or vanish before it (a failure detector then proposes
WorkerLost), or give a claim back before the start (RunReleased); a network that delays,
reorders and duplicates every input (but keeps a worker's records about an attempt in
order around a release, as Kafka does). Every clock but the broker's is off: workers,
the failure detector and the zombie stamp their records up to 8 s ahead or behind, and
the ledger's now is the delivery (broker append) time. An operator pauses and resumes
jobs (often around firings decided ahead), sends run_now and backfill requests, each
sometimes twice, reruns finished runs (under `forbid` too), switches a job's concurrency
policy, re-times a job to a one-off (maybe already past) and back, and closes a
dependency cycle through the step job and undoes it; a schedule-less step job may
depend on two jobs, its upstream notices reordered between upstreams. Finished runs are
forgotten after four, so withdrawn firings must outlive the trim. The ledger consumes
the resulting log; now and then it "crashes" and replays the log from its last
checkpoint, which must reproduce the same outputs.

Checked: never two runs for one (job, T), nor for one request; every scheduled time
outside pauses decided (run or skipped by policy); one accepted claim per (run, attempt)
until it is released, one start per (run, attempt), and no attempt executed by two
workers; every transition legal and in order; every run final once the world calms down;
and `cronlog audit`'s checker, given the ledger's settings, finds the history clean.
"""

from __future__ import annotations

import os
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, replace

import pytest

from connectors.audit.checker import AuditConfig, audit
from schemas.records import (
    TRANSITIONS,
    BackfillRequested,
    ClaimReply,
    ClaimRequested,
    DeadlineReached,
    FireProposed,
    JobDeleted,
    JobEvent,
    JobPaused,
    JobResumed,
    JobUpserted,
    LedgerInput,
    RerunRequested,
    RunEvent,
    RunFinished,
    RunNowRequested,
    RunReleased,
    RunStarted,
    UpstreamFinished,
    WorkerLost,
)
from schemas.spec import AtSchedule, ConcurrencyPolicy, EverySchedule, JobSpec, RetryPolicy
from streams.core.dag import cycle_through
from streams.core.ledger import LedgerConfig, input_job
from streams.core.schedule import fires_between
from tests.support.world import World

T0 = 1_800_000_000_000
SEEDS = int(os.environ.get("CRONLOG_SIM_SEEDS", "200"))
STEPS = int(os.environ.get("CRONLOG_SIM_STEPS", "1500"))

LEGAL = TRANSITIONS
CONFIG = LedgerConfig(
    claim_timeout_ms=4000,
    timeout_grace_ms=3000,
    misfire_grace_ms=3000,
    catchup_window_ms=120_000,
    max_lead_ms=2000,
    dependency_wait_ms=20_000,
    keep_final_runs=4,  # runs are forgotten soon: withdrawn ones must not be
)


def _holder(inp: LedgerInput) -> tuple[str, str, int] | None:
    """(worker, run, attempt) of a record a worker sends about an attempt it holds."""
    if isinstance(inp, ClaimRequested | RunStarted | RunFinished | RunReleased):
        return inp.worker_id, inp.run_id, inp.attempt
    return None


@dataclass
class Holding:
    """One accepted claim, as its worker lives it."""

    worker: str
    start_at: int
    done_at: int
    fate: str
    started: bool = False
    # A start not reported yet: it goes with the end (RunFinished.started_ms), as a
    # worker reports a short run once.
    unreported_start: int | None = None


class Sim:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.world = World(config=CONFIG, deliver_notices=False)
        self.now = T0
        self.log: list[tuple[LedgerInput, int]] = []
        self.inflight: list[LedgerInput] = []
        # A worker's records for one attempt, delivered in order (see `send`).
        self.ordered: dict[tuple[str, str, int | str] | None, list[LedgerInput]] = {}
        self.stale: World | None = None  # the zombie's frozen view
        self.node_down_until = 0
        # (run, attempt, claim number) -> what its holder does with it
        self.workers: dict[tuple[str, int, int], Holding] = {}
        self.claims: Counter[tuple[str, int]] = Counter()  # accepted claims so far
        self.events_seen = 0
        self.executed: Counter[tuple[str, int]] = Counter()  # real starts, by any worker
        self.dispatch_seen = 0
        self.checkpoint: tuple[World, int] = (self.world.snapshot(), 0)
        skews = (-8000, -2000, 0, 2000, 8000)
        self.skew = {who: self.rng.choice(skews) for who in ("w1", "w2", "zombie", "detector")}
        self.paused_at: dict[str, int] = {}
        self.stamped: dict[str, int] = {}  # each job's newest command stamp
        self.specs: dict[str, JobSpec] = {}

    def send(self, inp: LedgerInput) -> None:
        copies = [inp, inp] if self.rng.random() < 0.1 else [inp]  # duplicate delivery
        key = _holder(inp)
        if isinstance(inp, RunReleased):
            # A worker's records reach the log in the order it sent them (one idempotent
            # producer, one partition per job), and the ledger relies on it here: a
            # release never overtakes, nor is overtaken by, the worker's other records
            # for that attempt (a later claim of it must not be released by it).
            earlier = [x for x in self.inflight if _holder(x) == key]
            self.inflight = [x for x in self.inflight if _holder(x) != key]
            self.ordered.setdefault(key, []).extend([*earlier, *copies])
        elif key is not None and key in self.ordered:
            self.ordered[key].extend(copies)
        else:
            self.inflight.extend(copies)

    def register_jobs(self) -> None:
        for i in range(self.rng.randint(2, 5)):
            idempotent = self.rng.random() < 0.5
            spec = JobSpec(
                job_id=f"job{i}",
                owner="o",
                schedule=EverySchedule(self.rng.choice([2, 3, 5]) * 1000),
                command=("true",),
                timeout_s=self.rng.choice([1, 4, 10]),
                idempotent=idempotent,
                retry=RetryPolicy(
                    max_attempts=self.rng.randint(1, 3), backoff_s=1, max_backoff_s=4
                ),
                misfire=self.rng.choice(["run_all", "run_once", "skip"]),
                jitter_s=self.rng.choice([0, 0, 2]),
                concurrency=self.rng.choice(["allow", "allow", "forbid", "replace"]),
                depends_on=(f"job{i - 1}",) if i and self.rng.random() < 0.4 else (),
            )
            self.specs[spec.job_id] = spec
            self.deliver_now(JobUpserted(spec, self.now))
        if self.rng.random() < 0.5:  # a step that runs once both upstreams succeeded
            step = JobSpec(
                job_id="step",
                owner="o",
                schedule=None,
                command=("true",),
                depends_on=("job0", "job1"),
            )
            self.deliver_now(JobUpserted(step, self.now))
        self.requests = 0

    def operate(self) -> None:
        """An operator: pauses and resumes (often just around a firing decided ahead),
        run_now and backfill requests, each sometimes sent twice, in order per job (one
        commands partition per job)."""
        jobs = [j for j in self.world.jobs.values() if j.spec.schedule is not None]
        if not jobs or self.rng.random() > 0.03:
            return
        job_id = self.rng.choice(jobs).spec.job_id
        roll = self.rng.random()
        if roll < 0.25:
            self.edge_action(job_id)
        elif roll < 0.4:
            if job_id in self.paused_at:
                del self.paused_at[job_id]
                self.command(JobResumed(job_id, self.now))
            else:
                self.paused_at[job_id] = self.now
                self.command(JobPaused(job_id, self.now))
        elif roll < 0.5:
            every = self.rng.choice([2, 3, 5]) * 1000
            self.command(
                JobUpserted(replace(self.specs[job_id], schedule=EverySchedule(every)), self.now)
            )
        elif roll < 0.55:
            self.command(JobDeleted(job_id, self.now))
            self.command(JobUpserted(self.specs[job_id], self.now + self.rng.randint(0, 2000)))
        elif roll < 0.8:
            self.requests += 1
            request = f"r{self.rng.randint(max(1, self.requests - 3), self.requests)}"
            self.command(RunNowRequested(job_id, request, self.now))
        else:
            start = T0 - self.rng.randint(1, 20) * 1000
            request = f"b{self.rng.randint(1, 3)}"
            self.command(BackfillRequested(job_id, start, start + 15_000, self.now, request))

    def edge_action(self, job_id: str) -> None:
        """The operator actions at the ledger's edges: a rerun of a finished run (under
        `forbid` too), a switch of the concurrency policy while runs are decided ahead,
        a job re-timed to a one-off (maybe already past) and back, and a dependency that
        closes a cycle through the step job, undone later."""
        spec = self.specs[job_id]
        roll = self.rng.random()
        if roll < 0.35:
            finals = [r for r in self.world.runs.values() if r.job_id == job_id and r.final]
            if finals:
                run = self.rng.choice(finals)
                self.requests += 1
                self.command(RerunRequested(job_id, run.run_id, f"x{self.requests}", self.now))
        elif roll < 0.6:
            policy: ConcurrencyPolicy = self.rng.choice(["allow", "forbid", "replace"])
            self.specs[job_id] = replace(spec, concurrency=policy)
            self.command(JobUpserted(self.specs[job_id], self.now))
        elif roll < 0.8:
            once = replace(spec, schedule=AtSchedule(self.now + self.rng.randint(-5_000, 5_000)))
            self.command(JobUpserted(once, self.now))
            self.command(JobUpserted(spec, self.now + self.rng.randint(1_000, 8_000)))
        elif "step" in self.world.jobs:
            cyclic = replace(spec, schedule=None, depends_on=("step",))
            self.command(JobUpserted(cyclic, self.now))
            self.command(JobUpserted(spec, self.now + self.rng.randint(1_000, 8_000)))

    def command(self, inp: LedgerInput) -> None:
        job_id = input_job(inp)
        # Ingress stamps a command with the broker's append time on the job's commands
        # partition: never earlier than the job's previous command.
        stamp = max(inp.at_ms, self.stamped.get(job_id, 0))
        inp = replace(inp, at_ms=stamp)
        self.stamped[job_id] = stamp
        copies = [inp, inp] if self.rng.random() < 0.2 else [inp]
        self.ordered.setdefault(("op", job_id, 0), []).extend(copies)

    def deliver_now(self, inp: LedgerInput) -> None:
        # The broker's append time is the ledger's now; the input's stamp is its
        # producer's clock, skewed (see `stamp`), and must decide nothing.
        self.log.append((inp, self.now))
        self.world.apply(inp, self.now)
        # Notices for other jobs travel through the log like everything else, in order
        # per (upstream, dependent): one ledger writes them to one partition.
        for notice in self.world.outbox:
            if isinstance(notice, UpstreamFinished):
                key = ("notice", notice.upstream, notice.job_id)
                self.ordered.setdefault(key, []).append(notice)
            else:
                self.inflight.append(notice)
        self.world.outbox.clear()

    def stamp(self, who: str) -> int:
        """The time on `who`'s clock: workers and the zombie run seconds off."""
        return self.now + self.skew.get(who, 0)

    # -- actors -----------------------------------------------------------------------
    def scheduler(self, view: World, proposer: str) -> None:
        at = self.stamp(proposer)
        for job in view.jobs.values():
            lead = 1000 if job.spec.concurrency == "allow" else 0
            if job.next_due_ms is not None and job.next_due_ms <= self.now + lead:
                self.send(FireProposed(job.spec.job_id, job.next_due_ms, at, proposer))
        for run in view.runs.values():
            if run.deadline_ms is not None and run.deadline_kind and run.deadline_ms <= self.now:
                self.send(
                    DeadlineReached(run.job_id, run.run_id, run.attempt, run.deadline_kind, at)
                )

    def workers_act(self) -> None:
        w = self.world
        for request in w.dispatch[self.dispatch_seen :]:
            claimers = ["w1", "w2"] if self.rng.random() < 0.3 else [self.rng.choice(["w1", "w2"])]
            for worker in claimers:
                self.send(
                    ClaimRequested(
                        request.job_id, request.run_id, request.attempt, worker, self.stamp(worker)
                    )
                )
        self.dispatch_seen = len(w.dispatch)
        for event in w.events[self.events_seen :]:
            if isinstance(event, RunEvent) and event.state == "dispatched":
                self.claims[(event.run_id, event.attempt)] += 1
        self.events_seen = len(w.events)
        for run in list(w.runs.values()):
            if run.state not in ("dispatched", "running") or not run.worker_id:
                continue
            key = (run.run_id, run.attempt, self.claims[(run.run_id, run.attempt)])
            h = self.workers.get(key)
            if h is None:
                fate = self.rng.choice(
                    ["ok", "ok", "ok", "fail", "die", "slow", "release", "vanish"]
                )
                # The worker starts the run at its start time, never earlier; one that
                # vanishes is declared dead some time after the claim, maybe before then.
                start = max(self.now, run.not_before_ms or 0)
                end = self.now if fate == "vanish" else start
                h = self.workers[key] = Holding(
                    run.worker_id, start, end + self.rng.randint(0, 3000), fate
                )
            if h.fate == "release":
                if not h.started:  # released before its start: it never runs here
                    h.started = True
                    self.send(
                        RunReleased(
                            run.job_id,
                            run.run_id,
                            run.attempt,
                            h.worker,
                            "no room",
                            self.stamp(h.worker),
                        )
                    )
                continue
            if h.fate == "vanish":  # gone before the start: only the detector speaks
                if self.now >= h.done_at and self.rng.random() < 0.5:
                    lost = WorkerLost(
                        run.job_id, run.run_id, run.attempt, h.worker, self.stamp("detector")
                    )
                    self.send(lost)
                continue
            if not h.started:
                if self.now < h.start_at:
                    continue
                h.started = True
                self.executed[(run.run_id, run.attempt)] += 1
                stamp = self.stamp(h.worker)
                if h.fate in ("ok", "fail") and self.rng.random() < 0.3:
                    h.unreported_start = stamp  # reported with its end, however late
                else:
                    self.send(RunStarted(run.job_id, run.run_id, run.attempt, h.worker, stamp))
            if self.now < h.done_at:
                continue
            if h.fate == "die":
                if self.rng.random() < 0.5:  # the failure detector notices
                    lost = WorkerLost(
                        run.job_id, run.run_id, run.attempt, h.worker, self.stamp("detector")
                    )
                    self.send(lost)
            elif h.fate != "slow" or self.rng.random() < 0.05:
                code = 0 if h.fate in ("ok", "slow") else 1
                at = self.stamp(h.worker)
                self.send(
                    RunFinished(
                        run.job_id,
                        run.run_id,
                        run.attempt,
                        h.worker,
                        code,
                        "",
                        at,
                        started_ms=h.unreported_start,
                    )
                )

    def network(self) -> None:
        self.rng.shuffle(self.inflight)
        keep = int(len(self.inflight) * self.rng.random() * 0.5)
        deliver, self.inflight = self.inflight[keep:], self.inflight[:keep]
        # Ordered queues: a prefix of each, interleaved with the rest, in its own order.
        timed = [(self.rng.random(), inp) for inp in deliver]
        for key, queue in list(self.ordered.items()):
            n = self.rng.randint(0, len(queue))
            timed.extend(zip(sorted(self.rng.random() for _ in range(n)), queue[:n], strict=True))
            del queue[:n]
            if not queue:
                del self.ordered[key]
        timed.sort(key=lambda pair: pair[0])
        for _, inp in timed:
            self.deliver_now(inp)

    def crash_and_replay(self) -> None:
        """Restore the checkpoint and replay the log: the outputs must be identical."""
        snapshot, position = self.checkpoint
        replayed = snapshot.snapshot()
        for inp, now in self.log[position:]:
            replayed.apply(inp, now)
            replayed.outbox.clear()
        assert replayed.events == self.world.events
        assert replayed.dispatch == self.world.dispatch
        assert replayed.replies == self.world.replies
        assert replayed.jobs == self.world.jobs
        assert replayed.runs == self.world.runs
        self.checkpoint = (self.world.snapshot(), len(self.log))

    def step(self, calm: bool = False) -> None:
        self.now += self.rng.randint(50, 700)
        if not calm and self.rng.random() < 0.01:
            self.node_down_until = self.now + self.rng.randint(5_000, 60_000)
        if self.now >= self.node_down_until:
            self.scheduler(self.world, "node-a")
        if not calm and self.stale is not None and self.rng.random() < 0.2:
            self.scheduler(self.stale, "zombie")
        if self.rng.random() < 0.02:
            self.stale = self.world.snapshot()
        self.workers_act()
        if not calm:
            self.operate()
        self.network()
        if not calm and self.rng.random() < 0.005:
            self.crash_and_replay()


def check(sim: Sim) -> None:
    w = sim.world
    by_run: dict[str, list[RunEvent]] = defaultdict(list)
    for event in w.run_events():
        by_run[event.run_id].append(event)
    claims: Counter[tuple[str, int, int]] = Counter()
    starts: Counter[tuple[str, int]] = Counter()
    for run_id, events in by_run.items():
        seqs = [int(e.event_id.rsplit("#", 1)[1]) for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"{run_id}: {seqs}"
        previous: RunEvent | None = None
        released = 0  # claims released before their start, so far
        created = 0  # creation events (a release is `due` again, not a creation)
        for event in events:
            before = None if previous is None else previous.state
            assert event.state in LEGAL[before], f"{run_id}: {before} -> {event.state}"
            if previous is not None and before == "dispatched" and event.state == "due":
                # Released before the start: the same attempt, unclaimed, never started.
                assert event.attempt == previous.attempt, f"{run_id}: {event}"
                assert event.worker_id == "", f"{run_id}: {event}"
                assert not starts[(run_id, event.attempt)], f"{run_id}: {event}"
                assert event.reason.startswith(("released by", "worker ")), event.reason
                released += 1
            else:
                created += event.state in ("due", "skipped") and event.attempt == 1
            previous = event
            claims[(run_id, event.attempt, released)] += event.state == "dispatched"
            starts[(run_id, event.attempt)] += event.state == "running"
        # One (job, T) has one run: it was created once (one creation event).
        assert created <= 1, f"{run_id} created {created} times"
        assert events[-1].state in ("succeeded", "failed", "cancelled", "skipped"), (
            f"{run_id} ended {events[-1].state}"
        )
    assert max(claims.values(), default=0) <= 1
    assert max(starts.values(), default=0) <= 1
    # No attempt was executed by two workers (a claim released was never started).
    assert max(sim.executed.values(), default=0) <= 1
    # A claim is granted only to the worker its `dispatched` transition names, and an
    # attempt goes to no more workers than it had claims accepted (a release each).
    holders: dict[tuple[str, int], set[str]] = defaultdict(set)
    for event in w.run_events():
        if event.state == "dispatched":
            holders[(event.run_id, event.attempt)].add(event.worker_id)
    granted: dict[tuple[str, int], set[str]] = defaultdict(set)
    for reply in w.replies:
        if isinstance(reply, ClaimReply) and reply.granted:
            assert reply.worker_id in holders[(reply.run_id, reply.attempt)], reply
            granted[(reply.run_id, reply.attempt)].add(reply.worker_id)
    for (run_id, attempt), workers in granted.items():
        accepted = sum(n for (r, a, _), n in claims.items() if (r, a) == (run_id, attempt))
        assert len(workers) <= accepted, (run_id, attempt, workers)
    # No cycle is in effect once every notice is delivered: a refused job's upstreams
    # are not (the cycle probes of streams/core/ledger/dependencies.py).
    graph = {j.spec.job_id: j.spec.depends_on for j in w.jobs.values() if not j.deleted}
    in_effect = {job_id: ups for job_id, ups in graph.items() if not w.jobs[job_id].cycle}
    for job_id, ups in in_effect.items():
        assert cycle_through(job_id, ups, in_effect) is None, f"{job_id}: {graph}"
    for job in w.jobs.values():
        job_id = job.spec.job_id
        due = expected_firings(w, job_id, job.fired_ms)
        decided = {e.scheduled_ms for e in w.run_events() if e.job_id == job_id}
        window_skips = [t for t in due if t not in decided]
        # Only times older than the catch-up window may be decided without a record.
        assert all(t < job.fired_ms - CONFIG.catchup_window_ms for t in window_skips), (
            f"{job.spec.job_id}: undecided {window_skips[:3]}"
        )


AUDIT = AuditConfig(
    catchup_window_ms=CONFIG.catchup_window_ms,
    claim_timeout_ms=CONFIG.claim_timeout_ms,
    timeout_grace_ms=CONFIG.timeout_grace_ms,
    dependency_wait_ms=CONFIG.dependency_wait_ms,
    safety_margin_ms=10_000,
    final_slack_ms=60_000,
)


def audited(sim: Sim) -> None:
    """`cronlog audit`'s checker, given the simulated ledger's settings, agrees with the
    history the ledger wrote: the two say the same rules (forbid and reruns, withdrawn
    firings, cycles made and undone, DAG periods)."""
    report = audit([(e, 0, i) for i, e in enumerate(sim.world.events)], AUDIT, None)
    assert report.clean, report.violations[:3]


def expected_firings(w: World, job_id: str, fired_ms: int) -> list[int]:
    """The fire times a job's history makes due, from its job events alone: each spec
    fires in (registered or changed or resumed, next change or pause or delete], at
    the events' own times; the open end stops at the job's watermark."""
    due: list[int] = []
    spec, start = None, None  # the spec in force, and since when it fires (None: not)
    paused = deleted = False
    for e in w.events:
        if not isinstance(e, JobEvent) or e.job_id != job_id:
            continue
        if spec is not None and start is not None and e.kind in ("upserted", "paused", "deleted"):
            due += fires_between(spec.schedule, start, e.at_ms)
            start = None
        if e.kind == "upserted":
            paused = paused and not deleted  # a re-created job starts unpaused
            spec, start, deleted = e.spec, None if paused else e.at_ms, False
        elif e.kind == "resumed":
            paused, start = False, e.at_ms
        elif e.kind == "paused":
            paused = True
        else:
            deleted = True
    if spec is not None and start is not None:
        due += fires_between(spec.schedule, start, fired_ms)
    return due


def simulate(seed: int, steps: int) -> Sim:
    sim = Sim(seed)
    sim.register_jobs()
    for _ in range(steps):
        sim.step()
    # Calm down: stop the schedules, let every run finish.
    for key in [k for k in sim.ordered if k is not None and k[0] == "op"]:
        for inp in sim.ordered.pop(key):  # the operator's last commands land first
            sim.deliver_now(inp)
    for job_id in list(sim.world.jobs):
        sim.deliver_now(replace_pause(job_id, sim.now))
    for _ in range(400):
        sim.step(calm=True)
    sim.crash_and_replay()
    return sim


def replace_pause(job_id: str, now: int) -> LedgerInput:
    from schemas.records import JobPaused

    return JobPaused(job_id, now)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_simulation(seed: int) -> None:
    sim = simulate(seed, STEPS)
    check(sim)
    audited(sim)
    assert sim.world.run_events(), "the simulation produced no runs"


def test_checker_catches_a_duplicate_run() -> None:
    sim = simulate(0, 300)
    first = sim.world.run_events()[0]
    sim.world.events.append(replace(first, event_id=first.event_id.replace("#1", "#99")))
    with pytest.raises(AssertionError):
        check(sim)
