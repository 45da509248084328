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
from typing import Any

import orjson
import pytest

from connectors.audit.checker import AuditConfig, audit
from schemas.json import to_plain
from schemas.records import (
    TRANSITIONS,
    BackfillRequested,
    CancelOrder,
    CancelRequested,
    ClaimReply,
    ClaimRequested,
    DeadlineReached,
    DependencyLinked,
    DispatchFailed,
    DispatchRequest,
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
from schemas.spec import AtSchedule, ConcurrencyPolicy, JobSpec
from streams.core.ledger import LedgerConfig, input_job
from streams.core.params import ENV_NAME as PARAMS_ENV
from streams.core.schedule import fires_between
from tests.support import simspecs
from tests.support.world import World
from tests.unit.test_cycle_probes import cycle_in_effect

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
    # Backfills paced by their live runs (a 15 s backfill makes up to 16 runs): the rest
    # waits in the job's state and goes on as they end, with every other input between.
    backfill_live_runs=3,
    max_pending_backfills=4,
    max_live_manual_runs=1,  # a second run-now while one is live is dead-lettered
    # A secret is an owner's (simspecs' secret_env names these): one for every owner,
    # one each; a change naming the other owner's is refused (`Sim.operate`).
    secret_grants=simspecs.GRANTS,
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
        self.requests = 0
        # What the simulation played (the coverage guard reads these): the spec fields a
        # change varied, the schedule kinds, the input kinds delivered, resume modes.
        self.varied: set[str] = set()
        self.schedule_kinds: set[str] = set()
        self.kinds: set[str] = set()
        self.resumes: set[str] = set()
        self.replies_seen = 0
        # Attempts whose holder never reads a stop order in time: it starts them anyway.
        self.deaf: set[tuple[str, int]] = set()
        # The scheduler's lead for `allow` jobs: runs decided and claimed this far ahead
        # (just under the ledger's max_lead_ms), the window a change can hit them in.
        self.lead = self.rng.choice([1000, 1900])
        # (job, upstream, scheduled_ms) -> when a success notice was first delivered
        self.successes: dict[tuple[str, str, int], int] = {}
        self.started_at: dict[tuple[str, int], int] = {}  # (run, attempt) -> its start
        self.violations: list[str] = []  # found as they happen (a prune's plan)
        self.prunes = 0

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
        """Jobs with every field of their spec drawn (tests/support/simspecs.py); most
        belong to one owner (dependencies hold only within one), some to another."""
        rng = self.rng
        for i in range(rng.randint(2, 5)):
            owner = "p" if rng.random() < 0.2 else "o"
            spec = simspecs.fresh(rng, f"job{i}", owner, self.now, [f"job{i - 1}"] if i else [])
            if rng.random() < 0.6:
                spec = replace(spec, depends_on=())
            self.specs[spec.job_id] = spec
            self.schedule_kinds.add(simspecs.schedule_kind(spec.schedule, spec.depends_on))
            self.deliver_now(JobUpserted(spec, self.now))
        if rng.random() < 0.5:  # a step that runs once both upstreams succeeded
            step = JobSpec(
                job_id="step",
                owner="o",
                schedule=None,
                command=("true",),
                depends_on=("job0", "job1"),
            )
            self.specs["step"] = step
            self.deliver_now(JobUpserted(step, self.now))

    def operate(self) -> None:
        """An operator: changes of any field of a job's spec (often just before a firing
        decided ahead, or while runs are claimed, running or being cancelled), pauses
        and resumes (each `missed` mode), deletes and re-creations, run_now and backfill
        requests with and without parameter values (some invalid), cancels, a change of
        owner (refused), an `apply --prune`; each command sometimes sent twice, in order
        per job (one commands partition per job)."""
        rng = self.rng
        if rng.random() > 0.05:
            return
        known = {j: s for j, s in self.specs.items() if j in self.world.jobs}
        if not known:
            return
        alive = [j for j in known if not self.world.jobs[j].deleted]
        busy = [j for j in alive if self._busy(j)]
        if busy and rng.random() < 0.6:
            job_id = rng.choice(busy)
        elif alive:
            job_id = rng.choice(alive)
        else:
            job_id = rng.choice(list(known))
        if rng.random() < 0.2 and self.worst_moment():
            return
        roll = rng.random()
        if self.world.jobs[job_id].deleted or roll < 0.04:
            self.recreate(job_id)
        elif roll < 0.34:
            self.change(job_id)
        elif roll < 0.44:
            self.pause_or_resume(job_id)
        elif roll < 0.48:
            self.command(JobDeleted(job_id, self.now))
            if rng.random() < 0.5:
                self.recreate(job_id, self.now + rng.randint(0, 2000))
        elif roll < 0.62:
            self.requests += 1
            request = f"r{rng.randint(max(1, self.requests - 3), self.requests)}"
            given = rng.choice(simspecs.GIVEN_VALUES) if rng.random() < 0.5 else ()
            self.command(RunNowRequested(job_id, request, self.now, given))
        elif roll < 0.7:
            start = T0 - rng.randint(1, 20) * 1000
            request = f"b{rng.randint(1, 3)}"
            given = rng.choice(simspecs.GIVEN_VALUES) if rng.random() < 0.3 else ()
            self.command(BackfillRequested(job_id, start, start + 15_000, self.now, request, given))
        elif roll < 0.8:
            self.cancel(job_id)
        elif roll < 0.83:
            other = next(o for o in simspecs.OWNERS if o != self.specs[job_id].owner)
            self.varied.add("owner")  # refused: a job id belongs to its first owner
            self.command(JobUpserted(replace(self.specs[job_id], owner=other), self.now))
        elif roll < 0.845:
            # A secret of another owner named: refused (dead-lettered), the spec unchanged.
            other = next(o for o in simspecs.OWNERS if o != self.specs[job_id].owner)
            stolen = (("TOKEN", f"{other}-token"),)
            self.command(JobUpserted(replace(self.specs[job_id], secret_env=stolen), self.now))
        elif roll < 0.86:
            self.prune()
        else:
            self.edge_action(job_id)

    def worst_moment(self) -> bool:
        """A change at the worst moment for a run decided ahead, if some job has one:
        while it is claimed ahead of its time, the job paused (the stop order races the
        holder's start) or, its withdrawal pending already, its schedule changed too;
        its upstreams changed (`regate`); quick changes closing a cycle; a switch to
        `forbid` while runs are live."""
        if self.rng.random() < 0.5 and self.withdraw_claimed():
            return True
        actions = [self.regate, self.withdraw_claimed, self.close_cycle, self.forbid_live]
        self.rng.shuffle(actions)
        return any(action() for action in actions)

    def forbid_live(self) -> bool:
        """`allow` switched to `forbid` while two runs or more of the job are live (the
        ones whose time has passed keep their decision: they may run side by side)."""
        live: list[str] = []
        for job_id, job in self.world.jobs.items():
            if job.deleted or job_id not in self.specs or job.spec.concurrency != "allow":
                continue
            runs = [self.world.runs.get(r) for r in job.live_runs]
            if sum(1 for r in runs if r is not None and not r.final) >= 2:
                live.append(job_id)
        if not live:
            return False
        job_id = self.rng.choice(live)
        self.upsert(replace(self.specs[job_id], concurrency="forbid"), self.now)
        return True

    def close_cycle(self) -> bool:
        """Quick changes of one job, at one stamp, that close a cycle through its
        owner's jobs: its upstream switched from one job to another that both depend
        on it, or dropped and added back (a probe's first copy may come back by a path
        its origin has since dropped)."""
        rng = self.rng
        by_owner: dict[str, list[str]] = defaultdict(list)
        for job_id, spec in self.specs.items():
            job = self.world.jobs.get(job_id)
            if job is not None and not job.deleted and spec.schedule is not None:
                by_owner[spec.owner].append(job_id)
        owners = [o for o, jobs in by_owner.items() if len(jobs) >= 3]
        if not owners:
            return False
        x, b1, b2 = rng.sample(sorted(by_owner[rng.choice(owners)]), 3)
        for b in (b1, b2):
            if x not in self.specs[b].depends_on:
                self.upsert(replace(self.specs[b], depends_on=(x,)), self.now)
        spec = self.specs[x]
        switched = rng.random() < 0.5  # to another upstream, else dropped and back
        steps: list[tuple[str, ...]] = [(b1,), (b2,)] if switched else [(b1,), (), (b1,)]
        for ups in steps:
            self.upsert(replace(spec, depends_on=ups), self.now)
        return True

    def withdraw_claimed(self) -> bool:
        rng = self.rng
        claimed = []
        for job_id, job in self.world.jobs.items():
            if job.deleted or job_id not in self.specs:
                continue
            for run_id in job.live_runs:
                run = self.world.runs.get(run_id)
                if (
                    run is not None
                    and run.trigger == "schedule"
                    and run.state == "dispatched"
                    and run.scheduled_ms > self.now
                ):
                    claimed.append((job_id, run))
        if not claimed:
            return False
        # Worst of all: the run claimed is the last one max_runs allows.
        last = [
            (job_id, run)
            for job_id, run in claimed
            if self.world.jobs[job_id].spec.max_runs == self.world.jobs[job_id].schedule_runs
        ]
        job_id, run = rng.choice(last if last and rng.random() < 0.7 else claimed)
        if rng.random() < 0.5:  # its stop order loses the race (as after a failover)
            self.deaf.add((run.run_id, run.attempt))
        if run.cancelling or self.world.jobs[job_id].paused:
            spec, _ = simspecs.mutate(rng, self.specs[job_id], self.now, [], "schedule")
            self.upsert(spec, self.now)
        else:
            self.command(JobPaused(job_id, self.now))
        return True

    def regate(self) -> bool:
        """Upstreams changed at the worst moment: a job with a run waiting on them loses
        one or all of them, or a job with a run due ahead of its time gains one (of its
        owner's jobs: another owner's is never in effect). Whether it found such a job."""
        rng = self.rng
        waiting, ahead = [], []
        for job_id, job in self.world.jobs.items():
            if job.deleted or job_id not in self.specs or job.spec.schedule is None:
                continue
            for run_id in job.live_runs:
                run = self.world.runs.get(run_id)
                if run is None or run.trigger != "schedule":
                    continue
                if run.state == "waiting" and job.spec.depends_on:
                    waiting.append(job_id)
                elif run.state in ("due", "dispatched") and run.scheduled_ms > self.now:
                    ahead.append(job_id)
        if waiting and (not ahead or rng.random() < 0.5):
            job_id = rng.choice(waiting)
            ups = self.specs[job_id].depends_on  # as last sent: maybe none already
            if not ups:
                return False
            gone = rng.choice(ups)
            kept = () if rng.random() < 0.5 else tuple(u for u in ups if u != gone)
            self.varied.add("depends_on")
            self.upsert(replace(self.specs[job_id], depends_on=kept), self.now)
            return True
        if ahead:
            job_id = rng.choice(ahead)
            owner = self.specs[job_id].owner
            mine = [j for j, s in self.specs.items() if j != job_id and s.owner == owner]
            spec = self.specs[job_id]
            fresh = [j for j in mine if j not in spec.depends_on]
            if fresh:
                added = (*spec.depends_on, rng.choice(fresh))
                self.varied.add("depends_on")
                self.upsert(replace(spec, depends_on=added), self.now)
                return True
        return False

    def _busy(self, job_id: str) -> bool:
        """A firing is decided ahead or near, or a run is claimed, running or cancelling."""
        job = self.world.jobs[job_id]
        if job.next_due_ms is not None and job.next_due_ms <= self.now + CONFIG.max_lead_ms:
            return True
        for run_id in job.live_runs:
            run = self.world.runs.get(run_id)
            if run is not None and (run.state in ("dispatched", "running") or run.cancelling):
                return True
        return False

    def upsert(self, spec: JobSpec, at: int) -> None:
        """Send a registration or change, and note what it varies."""
        self.varied |= simspecs.differing(self.specs.get(spec.job_id), spec)
        self.schedule_kinds.add(simspecs.schedule_kind(spec.schedule, spec.depends_on))
        self.specs[spec.job_id] = spec
        self.command(JobUpserted(spec, at))

    def change(self, job_id: str) -> None:
        """One field of the spec changed; now and then a second change of the same job
        with the same stamp (its upstreams, both ways)."""
        rng = self.rng
        others = [j for j in self.specs if j != job_id]
        spec, _ = simspecs.mutate(rng, self.specs[job_id], self.now, others)
        self.upsert(spec, self.now)
        if rng.random() < 0.15:
            again, _ = simspecs.mutate(rng, spec, self.now, others, "depends_on")
            self.upsert(again, self.now)

    def recreate(self, job_id: str, at: int | None = None) -> None:
        spec = self.specs[job_id]
        if self.rng.random() < 0.5 and job_id != "step":
            others = [j for j in self.specs if j != job_id]
            spec = replace(
                simspecs.fresh(self.rng, job_id, spec.owner, self.now, others), depends_on=()
            )
        self.upsert(spec, self.now if at is None else at)

    def pause_or_resume(self, job_id: str) -> None:
        job = self.world.jobs[job_id]
        if job.paused if self.rng.random() < 0.9 else not job.paused:
            missed = self.rng.choice(["skip", "last", "all"])
            self.resumes.add(missed)
            self.command(JobResumed(job_id, self.now, missed))
        else:
            self.command(JobPaused(job_id, self.now))

    def cancel(self, job_id: str) -> None:
        """Cancel a live run, mostly one claimed or running (its stop order races the
        worker's start); sometimes twice."""
        runs = [self.world.runs.get(r) for r in self.world.jobs[job_id].live_runs]
        live = [r for r in runs if r is not None and not r.final]
        if not live:
            return
        held = [r for r in live if r.state in ("dispatched", "running")]
        run = self.rng.choice(held if held and self.rng.random() < 0.7 else live)
        self.command(CancelRequested(job_id, run.run_id, self.now))

    def prune(self) -> None:
        """`cronlog apply --prune` planned by connectors/apply.py over files that declare
        some owners (a top-level `owner:`, maybe with no jobs) or only name them on their
        jobs, managed by one name: it deletes only jobs of the owners the files declare,
        that carry that name, and that the files do not list; with no owner at all it
        refuses (PruneScopeError), never pruning every owner's jobs."""
        from connectors.apply import Desired, PruneScopeError, plan

        rng = self.rng
        self.prunes += 1
        managed = rng.choice(simspecs.MANAGERS[1:])
        declared = set(rng.sample(simspecs.OWNERS, k=rng.randint(0, len(simspecs.OWNERS))))
        registered: list[dict[str, Any]] = [
            {"job_id": j, "owner": job.spec.owner, "spec": to_plain(job.spec)}
            for j, job in self.world.jobs.items()
            if not job.deleted and job.version > 0
        ]
        desired = [
            Desired(
                doc={"job_id": row["job_id"], "owner": row["owner"], "managed_by": managed},
                spec=replace(self.world.jobs[row["job_id"]].spec, managed_by=managed),
                where=f"sim.yaml:{i + 1}",
            )
            for i, row in enumerate(registered)
            if row["owner"] in declared and rng.random() < 0.5
        ]
        top_level = rng.random() < 0.5  # the files' `owner:`, else the jobs' own owners
        scope = declared if top_level else {d.spec.owner for d in desired}
        listed = {d.spec.job_id for d in desired}
        rows = {row["job_id"]: row for row in registered}
        try:
            changes = plan(
                desired, registered, managed, prune=True, owners=declared if top_level else None
            )
        except PruneScopeError:
            if scope:
                self.violations.append(f"prune of owners {sorted(scope)} refused")
            return
        for change in changes:
            if change.kind != "delete":
                continue
            row = rows.get(change.job_id)
            if (
                row is None
                or row["owner"] not in scope
                or row["spec"].get("managed_by") != managed
                or change.job_id in listed
            ):
                self.violations.append(
                    f"prune (managed_by {managed!r}, files of owners {sorted(scope)}) "
                    f"deletes {change.job_id} of owner {row and row['owner']!r}"
                )
            self.command(JobDeleted(change.job_id, self.now))

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
            self.upsert(replace(spec, concurrency=policy), self.now)
        elif roll < 0.8:
            once = replace(spec, schedule=AtSchedule(self.now + self.rng.randint(-5_000, 5_000)))
            self.upsert(once, self.now)
            self.upsert(spec, self.now + self.rng.randint(1_000, 8_000))
        elif "step" in self.world.jobs and job_id != "step":
            cyclic = replace(spec, schedule=None, depends_on=("step",))
            self.upsert(cyclic, self.now)
            self.upsert(spec, self.now + self.rng.randint(1_000, 8_000))

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
        self.kinds.add(type(inp).__name__)
        if isinstance(inp, UpstreamFinished) and inp.succeeded:
            self.successes.setdefault((inp.job_id, inp.upstream, inp.scheduled_ms), self.now)
        self.world.apply(inp, self.now)
        # Notices for other jobs travel through the log like everything else, in order
        # per (sender, receiver): the sender's ledger writes them, in the order of its
        # decisions, to the receiver's one partition (links and probes as outcomes).
        sender = input_job(inp)
        for notice in self.world.outbox:
            if isinstance(notice, UpstreamFinished | DependencyLinked):
                key = ("notice", sender, notice.job_id)
                self.ordered.setdefault(key, []).append(notice)
            else:
                self.inflight.append(notice)
        self.world.outbox.clear()

    def upstream_successes(self) -> dict[tuple[str, str, int], int]:
        """(job, upstream, scheduled time) -> when the job's ledger first read that the
        upstream's run for that time succeeded."""
        return self.successes

    def stamp(self, who: str) -> int:
        """The time on `who`'s clock: workers and the zombie run seconds off."""
        return self.now + self.skew.get(who, 0)

    # -- actors -----------------------------------------------------------------------
    def scheduler(self, view: World, proposer: str) -> None:
        at = self.stamp(proposer)
        for job in view.jobs.values():
            lead = self.lead if job.spec.concurrency == "allow" else 0
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
            if request.resources.gpu:  # no worker has one: the dispatcher gives up
                why = "no worker can ever run it (gpu)"
                self.send(
                    DispatchFailed(
                        request.job_id, request.run_id, request.attempt, why, self.stamp("d")
                    )
                )
                continue
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
        self.stop_orders()
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
                self.started_at.setdefault((run.run_id, run.attempt), self.now)
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
                code = {"ok": 0, "slow": 0, "stopped": None}.get(h.fate, 1)
                at = self.stamp(h.worker)
                self.send(
                    RunFinished(
                        run.job_id,
                        run.run_id,
                        run.attempt,
                        h.worker,
                        code,
                        "stopped by order" if code is None else "",
                        at,
                        started_ms=h.unreported_start,
                    )
                )

    def stop_orders(self) -> None:
        """Workers read their stop orders, some late (or never): one not started yet
        releases the attempt, one started is killed; an order that comes after the start
        time lost the race (the attempt started anyway, and the ledger must say so)."""
        for reply in self.world.replies[self.replies_seen :]:
            if not isinstance(reply, CancelOrder) or self.rng.random() < 0.3:
                continue
            if (reply.run_id, reply.attempt) in self.deaf:
                continue
            for (run_id, attempt, _), h in self.workers.items():
                if (run_id, attempt) != (reply.run_id, reply.attempt):
                    continue
                if h.worker != reply.worker_id or h.fate in ("vanish", "die"):
                    continue
                if not h.started:
                    h.fate = "release"
                elif h.fate not in ("release", "stopped"):
                    h.fate, h.done_at = "stopped", min(h.done_at, self.now + 500)
        self.replies_seen = len(self.world.replies)

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
            if self.rng.random() < 0.03:  # the narrow window of a run claimed ahead
                self.withdraw_claimed()
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
    for request in w.dispatch:  # a secret reaches only a job of an owner it is granted to
        assert not CONFIG.secret_grants.refused(request.owner, request.secret_env), request
    for run_id, events in by_run.items():
        seqs = [int(e.event_id.rsplit("#", 1)[1]) for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), (
            f"run created twice, or a gap: {run_id}: {seqs}"
        )
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
    # are not (the cycle probes of streams/core/ledger/dependencies.py), nor is an
    # upstream of another owner (its link and outcomes are refused, no probe crosses).
    graph = {j.spec.job_id: j.spec.depends_on for j in w.jobs.values() if not j.deleted}
    assert cycle_in_effect(w) is None, f"cycle in effect: {cycle_in_effect(w)}: {graph}"
    for job in w.jobs.values():
        job_id = job.spec.job_id
        due = expected_firings(w, job_id, job.fired_ms)
        decided = {e.scheduled_ms for e in w.run_events() if e.job_id == job_id}
        window_skips = [t for t in due if t not in decided and not _spent(w, job_id, t)]
        # Only times older than the catch-up window may be decided without a record.
        assert all(t < job.fired_ms - CONFIG.catchup_window_ms for t in window_skips), (
            f"{job.spec.job_id}: undecided {window_skips[:3]}"
        )


def _spent(w: World | Any, job_id: str, t: int) -> bool:
    """Whether the job's schedule had made its `max_runs` runs before `t`: a time after
    that is not due. Lenient: a withdrawn run counts here, and so do the runs of the
    job's earlier lives (the ledger counts over the id's whole history)."""
    spec = spec_at(w, job_id, t)
    if spec is None or spec.max_runs is None:
        return False
    life_start = 0
    made = {
        e.run_id
        for e in w.run_events()
        if e.job_id == job_id
        and e.trigger == "schedule"
        and (e.state in ("due", "waiting") or "give it to run-now" in e.reason)
        and life_start <= e.at_ms
        and e.scheduled_ms < t
    }
    return len(made) >= spec.max_runs


def _life_starts(w: World | Any, job_id: str) -> list[int]:
    """When each life of the job began: its registration, and each after a delete."""
    starts, alive = [], False
    for e in w.events:
        if isinstance(e, JobEvent) and e.job_id == job_id:
            if e.kind == "upserted" and not alive:
                starts.append(e.at_ms)
            alive = e.kind != "deleted"
    return starts


def spec_at(w: World | Any, job_id: str, t: int) -> JobSpec | None:
    """The spec in force for the job's fire time `t`: the newest change before t (a
    change at t decides t under the old spec), None if deleted or not registered."""
    spec: JobSpec | None = None
    for e in w.events:
        if isinstance(e, JobEvent) and e.job_id == job_id and e.at_ms < t:
            if e.kind == "upserted":
                spec = e.spec
            elif e.kind == "deleted":
                spec = None
    return spec


DEPENDENCY_REASONS = ("upstream", "did not finish in time", "dependency cycle")


def check_rules(sim: Sim) -> None:
    """The rules of the spec's fields, after a seed (issue 52): max_runs per life,
    parameters at dispatch, no dependency gate without upstreams, every scheduled
    execution gated by the upstreams in effect, a prune's deletes."""
    w = sim.world
    assert not sim.violations, sim.violations[:3]
    # The job's spec in log order at each event, its lives, and each run's gate.
    current: dict[str, JobSpec | None] = {}
    life: Counter[str] = Counter()
    life_max: dict[tuple[str, int], list[int | None]] = defaultdict(list)
    run_life: dict[str, tuple[str, int]] = {}
    previous: dict[str, RunEvent] = {}
    # per run: the spec in force when its current chain (creation or revival) was made
    # due, and whether an operator's rerun made the attempt due since
    gate_spec: dict[str, JobSpec | None] = {}
    chain_start: dict[str, bool] = {}
    rerun_attempts: set[tuple[str, int]] = set()
    gated: dict[tuple[str, int], JobSpec | None] = {}
    # (d') A change of upstreams re-gates the runs decided ahead of it: a scheduled run
    # `due` or `waiting` for a time after the change when the ledger applies it is
    # withdrawn (its cancel comes before the change's own event) and decided again;
    # one that is neither and starts all the same ran on the old upstreams.
    states: dict[str, RunEvent] = {}
    regate: set[str] = set()
    for e in w.events:
        if isinstance(e, JobEvent):
            old = current.get(e.job_id)
            if (
                e.kind == "upserted"
                and e.spec is not None
                and old is not None
                and e.spec.schedule is not None
                and e.spec.depends_on != old.depends_on
            ):
                regate |= {
                    r.run_id
                    for r in states.values()
                    if r.job_id == e.job_id
                    and r.trigger == "schedule"
                    and r.state in ("due", "waiting")
                    and r.scheduled_ms > e.at_ms
                }
            if e.kind == "upserted":
                if current.get(e.job_id) is None:
                    life[e.job_id] += 1
                current[e.job_id] = e.spec
                life_max[(e.job_id, life[e.job_id])].append(
                    None if e.spec is None else e.spec.max_runs
                )
            elif e.kind == "deleted":
                current[e.job_id] = None
            continue
        before = previous.get(e.run_id)
        previous[e.run_id] = e
        states[e.run_id] = e
        if e.run_id in regate:
            assert e.state != "running", f"{e.run_id} ran on the upstreams it had before a change"
            if e.state in ("cancelled", "skipped", "failed", "succeeded"):
                regate.discard(e.run_id)
        spec_now = current.get(e.job_id)
        fresh = before is None or (before.state == "cancelled" and e.state in ("due", "waiting"))
        if fresh:
            chain_start[e.run_id] = True
            if e.trigger == "schedule":
                run_life[e.run_id] = (e.job_id, life[e.job_id])
        if e.state == "due":
            if e.reason.startswith("rerun"):
                rerun_attempts.add((e.run_id, e.attempt))
            elif e.attempt != (before.attempt if before else 0) and (
                before is not None and (before.run_id, before.attempt) in rerun_attempts
            ):
                rerun_attempts.add((e.run_id, e.attempt))  # a retry of a rerun
            if chain_start.pop(e.run_id, False):
                gate_spec[e.run_id] = spec_now
            gated[(e.run_id, e.attempt)] = gate_spec.get(e.run_id, spec_now)
        # (c) No dependency gate for a firing without upstreams at its time and when decided.
        if e.trigger == "schedule" and e.state in ("waiting", "skipped"):
            at_t = spec_at(w, e.job_id, e.scheduled_ms)
            if not (spec_now and spec_now.depends_on) and not (at_t and at_t.depends_on):
                assert e.state != "waiting", f"{e.run_id} waits without upstreams: {e}"
                assert not any(r in e.reason for r in DEPENDENCY_REASONS), (
                    f"{e.run_id} skipped for a dependency without upstreams: {e.reason}"
                )
    # (a) A life's executed schedule runs never exceed its largest max_runs.
    executed: dict[tuple[str, int], set[str]] = defaultdict(set)
    for (run_id, attempt), n in sim.executed.items():
        if n and run_id in run_life and (run_id, attempt) not in rerun_attempts:
            executed[run_life[run_id]].add(run_id)
    for key, runs in executed.items():
        limits = life_max[key]
        if limits and None not in limits:
            bound = max(x for x in limits if x is not None)
            assert len(runs) <= bound, (
                f"{key[0]} (life {key[1]}) executed {len(runs)} schedule runs, max_runs "
                f"{bound}: {sorted(runs)[:5]}"
            )
    # (b) No dispatch with a placeholder left or a required parameter missing.
    assert len(w.dispatch_specs) == len(w.dispatch)
    for request, specs in zip(w.dispatch, w.dispatch_specs, strict=True):
        assert specs, f"{request.run_id}: dispatched with no spec registered"
        faults = [_param_fault(request, spec) for spec in specs]
        assert not all(faults), faults[0]
    # (d) Every executed scheduled run was gated by the upstreams in effect at its time
    # and when it was made due: each reported a success in its period, delivered first.
    ran: dict[str, list[int]] = defaultdict(list)  # each job's executed fire times
    for (run_id, _), _ in sim.started_at.items():
        run = previous.get(run_id)
        if run is not None and run.trigger == "schedule":
            ran[run.job_id].append(run.scheduled_ms)
    successes = sim.upstream_successes()
    for (run_id, attempt), started in sim.started_at.items():
        run = previous.get(run_id)
        if run is None or run.trigger != "schedule" or (run_id, attempt) in rerun_attempts:
            continue
        t = run.scheduled_ms
        at_t, at_due = spec_at(w, run.job_id, t), gated.get((run_id, attempt))
        ups = set(at_t.depends_on if at_t else ()) & set(at_due.depends_on if at_due else ())
        low = max((x for x in ran[run.job_id] if x < t), default=-1)
        for upstream in sorted(ups):
            ok = [
                s
                for (job, up, s), when in successes.items()
                if job == run.job_id and up == upstream and low < s <= t and when <= started
            ]
            assert ok, (
                f"{run_id}#{attempt} ran at {started} without a success of {upstream} "
                f"in ({low}, {t}]"
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
    said = " | ".join(
        f"{v.kind} {v.run_id or v.job_id}: {v.detail}" for v in report.violations[:20]
    )
    assert report.clean, f"the audit finds: {said}"


def _param_fault(request: DispatchRequest, spec: JobSpec) -> str:
    """What a dispatch lacks under `spec`'s parameters: "" when nothing."""
    env = dict(request.env)
    required = [p.name for p in spec.params if p.default is None]
    if spec.params and (spec.params_in_command or required):
        if PARAMS_ENV not in env:
            return f"{request.run_id}#{request.attempt}: no {PARAMS_ENV}"
        values = orjson.loads(env[PARAMS_ENV])
        missing = [n for n in required if n not in values]
        if missing:
            return f"{request.run_id}#{request.attempt} lacks {missing}: {env}"
    if spec.params and spec.params_in_command:
        left = [p.name for p in spec.params if any(f"{{{p.name}}}" in a for a in request.command)]
        if left:
            return f"{request.run_id}#{request.attempt}: {request.command} keeps {left}"
    return ""


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
            due += fires_between(spec.schedule, start, e.at_ms, spec.dst)
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
        due += fires_between(spec.schedule, start, fired_ms, spec.dst)
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
    check_rules(sim)
    audited(sim)
    assert sim.world.run_events(), "the simulation produced no runs"


def test_checker_catches_a_duplicate_run() -> None:
    sim = simulate(0, 300)
    first = sim.world.run_events()[0]
    sim.world.events.append(replace(first, event_id=first.event_id.replace("#1", "#99")))
    with pytest.raises(AssertionError):
        check(sim)
