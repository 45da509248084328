"""The scheduler and ledger loops end to end over the in-memory Kafka (pure: no
broker, no sleeps; time is a manual clock that moves as the loops wait).

Two schedulers propose every firing (a partition assignment is not a lease: they
may repeat each other), one is killed -9 and a third starts later, and a ledger
dies mid-transaction and comes back under its id: every firing of every job still has
exactly one run, and none is missed."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest

from schemas.codec import JOB_LOG, RUN_EVENTS
from schemas.records import DeadlineReached, FireProposed, JobEvent, JobUpserted, RunEvent
from schemas.spec import EverySchedule, JobSpec
from streams import ledger as ledger_module
from streams.core.clock import ManualClock
from streams.core.ledger import LedgerConfig
from streams.core.proposals import ProposalPolicy
from streams.core.schedule import fires_between
from streams.core.timing import TIMING
from streams.kafka import producer_config
from streams.ledger import Ledger
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.scheduler import Scheduler, SchedulerConfig
from streams.settings import Settings

SETTINGS = Settings(partitions=4, topic_prefix="loops.")
JOBS = 12
EVERY_MS = 2000


class Killed(BaseException):
    """kill -9 at a client call: nothing in the loops catches it."""


def _kill_at(log: MemoryLog, ledger: Ledger, call: str) -> None:
    """Kill `ledger` at its producer's next `call`."""

    def fault(name: str, who: object) -> None:
        if name == call and who is ledger.producer:
            log.faults.remove(fault)
            raise Killed(call)

    log.faults.append(fault)


def test_every_firing_once_through_schedulers_and_a_ledger_that_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)  # real time, not the log's
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_catalogue(SETTINGS)
    clients = MemoryClients(log)

    def ledger() -> Ledger:
        loop = Ledger(SETTINGS, LedgerConfig(), node_id="L", clients=clients, clock=clock)
        assert loop.open()
        return loop

    def scheduler(name: str) -> Scheduler:
        loop = Scheduler(SETTINGS, name, clients=clients, clock=clock)
        loop.open()
        return loop

    ledgers = [ledger()]
    schedulers = {"s1": scheduler("s1"), "s2": scheduler("s2")}
    commands = clients.producer(producer_config(SETTINGS))
    for i in range(JOBS):
        spec = JobSpec(
            job_id=f"job{i}",
            owner="o",
            schedule=EverySchedule(EVERY_MS),
            command=("true",),
            misfire="run_all",  # a firing proposed late still runs: none may be missed
        )
        upsert = JobUpserted(spec, int(clock.time() * 1000))
        commands.produce(
            SETTINGS.topic("job-log"), key=spec.job_id.encode(), value=JOB_LOG.encode(upsert)
        )

    start = clock.time()
    killed_ledger = killed_scheduler = False
    restarts = 0
    while clock.time() - start < 60:
        elapsed = clock.time() - start
        if elapsed > 15 and not killed_scheduler:
            killed_scheduler = True
            dead = schedulers.pop("s1")  # kill -9: no close, its membership lapses
            del dead
        if elapsed > 30 and "s3" not in schedulers:
            schedulers["s3"] = scheduler("s3")
        if elapsed > 25 and not killed_ledger:
            killed_ledger = True
            _kill_at(log, ledgers[0], "commit_transaction")
        for proposer in list(schedulers.values()):
            proposer.step()
        for loop in list(ledgers):
            try:
                loop.step()
            except Killed:
                restarts += 1
                # Restarted under its id once the dead one's session lapsed (a live
                # member under its id holds it: streams/identity.py); fences the dead one.
                clock.advance(TIMING.consumer_session_s + 1)
                ledgers = [ledger()]
    end_ms = int(clock.time() * 1000)

    events = [
        RUN_EVENTS.decode(m.value() or b"") for m in log.records(SETTINGS.topic("run-events"))
    ]
    registered = {e.job_id: e.at_ms for e in events if isinstance(e, JobEvent)}
    created = Counter(
        (e.job_id, e.scheduled_ms)
        for e in events
        if isinstance(e, RunEvent) and e.state == "due" and e.attempt == 1
    )
    assert killed_scheduler
    assert restarts == 1  # the ledger died at its commit once
    assert len(registered) == JOBS
    assert max(created.values()) == 1, "a firing ran twice"
    for job_id, at_ms in registered.items():
        due = fires_between(EverySchedule(EVERY_MS), at_ms, end_ms - 3000)
        have = sorted(t for (j, t) in created if j == job_id)
        missed = sorted(set(due) - set(have))
        assert not missed, f"{job_id} missed {missed}"
        assert len(due) >= 25  # the minute ran: ~29 firings each


def _one_ledger(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[ManualClock, MemoryLog, MemoryClients, Ledger]:
    """An in-memory Kafka with the catalogue's topics and one ledger on it, open."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)  # real time, not the log's
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_catalogue(SETTINGS)
    clients = MemoryClients(log)
    ledger = Ledger(SETTINGS, LedgerConfig(), node_id="L", clients=clients, clock=clock)
    assert ledger.open()
    return clock, log, clients, ledger


class _Behind:
    """A machine whose wall clock is `offset_s` behind the broker's (same monotonic)."""

    def __init__(self, clock: ManualClock, offset_s: float) -> None:
        self.clock, self.offset_s = clock, offset_s

    def time(self) -> float:
        return self.clock.time() - self.offset_s

    def monotonic(self) -> float:
        return self.clock.monotonic()


def test_a_scheduler_an_hour_behind_with_no_worker_proposes_on_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No heartbeat and nothing due by its own clock: the scheduler learns the broker's time
    from a clock probe of its own (its delivery report's stamp) and proposes every
    firing at its time; the ledger decides nothing for the probe."""
    clock, log, clients, ledger = _one_ledger(monkeypatch)
    scheduler = Scheduler(SETTINGS, "behind", clients=clients, clock=_Behind(clock, 3600.0))
    scheduler.open()
    spec = JobSpec(job_id="j", owner="o", schedule=EverySchedule(EVERY_MS), command=("true",))
    registered = int(clock.time() * 1000)
    commands = clients.producer(producer_config(SETTINGS))
    commands.produce(
        SETTINGS.topic("job-log"), key=b"j", value=JOB_LOG.encode(JobUpserted(spec, registered))
    )
    start = clock.time()
    while clock.time() - start < 30:
        scheduler.step()
        ledger.step()
    events = [
        RUN_EVENTS.decode(m.value() or b"") for m in log.records(SETTINGS.topic("run-events"))
    ]
    runs = [e for e in events if isinstance(e, RunEvent) and e.attempt == 1]
    assert not [e for e in runs if e.state == "skipped"], "firings became misfires"
    created = {e.scheduled_ms: e.at_ms for e in runs if e.state == "due"}
    # Every firing from the first probe's answer on (within PROBE_AFTER_S), each on time.
    due = fires_between(
        EverySchedule(EVERY_MS), registered + 7_000, int(clock.time() * 1000) - 3_000
    )
    assert due
    assert all(t in created for t in due), (due, sorted(created))
    assert all(created[t] - t < 1_000 for t in due), [created[t] - t for t in due]
    probes = [
        JOB_LOG.decode(m.value() or b"")
        for m in log.records(SETTINGS.topic("job-log"))
        if m.key() is None
    ]
    assert probes
    assert all(isinstance(p, FireProposed) and p.job_id == "" for p in probes)


def test_an_upstream_removed_within_the_lead_frees_the_firing_on_the_real_loops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """D depends on U, both every minute; D's run for T is created `waiting` ahead of T
    (the scheduler's lead); 3 s before T the owner drops the dependency. The real
    scheduler and ledger decide T again under no upstreams: the run is due at T, not
    left waiting for a day (issue 52)."""
    clock, log, clients, ledger = _one_ledger(monkeypatch)
    lead = SchedulerConfig(ProposalPolicy(lead_ms=int(TIMING.lead_s * 1000)))  # the default
    scheduler = Scheduler(SETTINGS, "s", lead, clients=clients, clock=clock)
    scheduler.open()
    commands = clients.producer(producer_config(SETTINGS))
    minute = EverySchedule(60_000)
    upstream = JobSpec(job_id="u", owner="o", schedule=minute, command=("true",))
    dependent = JobSpec(
        job_id="d", owner="o", schedule=minute, command=("true",), depends_on=("u",)
    )

    def write(spec: JobSpec) -> None:
        upsert = JobUpserted(spec, int(clock.time() * 1000))
        key = spec.job_id.encode()
        commands.produce(SETTINGS.topic("job-log"), key=key, value=JOB_LOG.encode(upsert))

    write(upstream)
    write(dependent)
    now_ms = int(clock.time() * 1000)
    t = fires_between(minute, now_ms + 30_000, now_ms + 120_000)[0]  # a firing to come

    def run_until(until_ms: int) -> list[RunEvent]:
        while clock.time() * 1000 < until_ms:
            scheduler.step()
            ledger.step()
        events = [
            RUN_EVENTS.decode(m.value() or b"") for m in log.records(SETTINGS.topic("run-events"))
        ]
        return [e for e in events if isinstance(e, RunEvent) and e.job_id == "d"]

    ahead = run_until(t - 3_000)
    assert [e.state for e in ahead if e.scheduled_ms == t] == ["waiting"]  # decided ahead
    write(replace(dependent, depends_on=()))
    states = [e.state for e in run_until(t + 5_000) if e.scheduled_ms == t]
    assert states == ["waiting", "cancelled", "due"], states  # withdrawn, decided again


def test_a_ledger_behind_is_not_flooded_with_repeats_of_what_it_has_not_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The soak of issue 54 replayed small: runs nobody claims (no worker) reach their
    claim deadline while the ledger reads nothing for a minute. The scheduler notices each
    deadline once and each new firing once, and repeats none of them while the ledger has
    not read the first (before: every 3 s, 20 repeats a run in that minute, which left a
    ledger behind ever further behind). Once the ledger reads again it answers every
    notice and the firings, and the scheduler follows the runs' next deadlines."""
    clock, log, clients, ledger = _one_ledger(monkeypatch)
    scheduler = Scheduler(SETTINGS, "s", clients=clients, clock=clock)
    scheduler.open()
    commands = clients.producer(producer_config(SETTINGS))
    every = EverySchedule(20_000)
    jobs = [f"j{i}" for i in range(40)]
    for job_id in jobs:
        spec = JobSpec(job_id=job_id, owner="o", schedule=every, command=("true",))
        upsert = JobUpserted(spec, int(clock.time() * 1000))
        commands.produce(
            SETTINGS.topic("job-log"), key=job_id.encode(), value=JOB_LOG.encode(upsert)
        )

    def proposals() -> list[object]:
        return [
            JOB_LOG.decode(m.value() or b"")
            for m in log.records(SETTINGS.topic("job-log"))
            if m.key() is not None
        ]

    def both_until(until: float) -> None:
        while clock.time() < until:
            scheduler.step()
            ledger.step()

    # Runs created, placed, unclaimed: their claim deadlines come and are answered.
    both_until(clock.time() + TIMING.claim_timeout_s + 30)
    before = len(proposals())
    notices_before = [p for p in proposals() if isinstance(p, DeadlineReached)]
    assert notices_before, "no claim deadline came: the test shows nothing"

    # The ledger reads nothing for a minute (paused, overloaded); the scheduler goes on.
    paused_at = clock.time()
    while clock.time() < paused_at + 60:
        scheduler.step()
    during = proposals()[before:]
    noticed: dict[tuple[str, int], list[int]] = {}
    for p in during:
        if isinstance(p, DeadlineReached):
            noticed.setdefault((p.run_id, p.attempt), []).append(p.at_ms)
    fires = Counter((p.job_id, p.scheduled_ms) for p in during if isinstance(p, FireProposed))
    assert noticed
    assert fires
    # A run's notices in the pause: one per claim deadline (the ledger read the last
    # notice before it paused and set the next deadline a claim timeout on), no repeats.
    claim_ms = int(TIMING.claim_timeout_s * 1000)
    gaps = [b - a for times in noticed.values() for a, b in itertools.pairwise(times)]
    assert all(gap >= claim_ms for gap in gaps), sorted(gaps)[:5]
    assert max(fires.values()) == 1, fires.most_common(3)
    assert scheduler.held > 0
    assert sum(t.fires.held for t in scheduler.timers.values()) > 0

    # The ledger reads again: every notice and firing of the pause is answered.
    resumed = len(proposals())
    both_until(clock.time() + 60)
    events = [
        RUN_EVENTS.decode(m.value() or b"") for m in log.records(SETTINGS.topic("run-events"))
    ]
    created = {(e.job_id, e.scheduled_ms) for e in events if isinstance(e, RunEvent)}
    assert set(fires) <= created, set(fires) - created
    # Nothing lost to a hold: every job has a run of a firing due in the pause.
    pause_ms = (int(paused_at * 1000), int(paused_at * 1000) + 60_000)
    late = {j for (j, t) in created if pause_ms[0] <= t <= pause_ms[1]}
    assert late == set(jobs), set(jobs) - late
    assert log.lag(SETTINGS.group("ledger"), SETTINGS.topic("job-log")) == 0
    after = [p for p in proposals()[resumed:] if isinstance(p, DeadlineReached)]
    assert after, "the runs' next claim deadlines were not noticed"
