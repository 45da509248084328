"""The dispatcher and failure detector process on the in-memory Kafka, on a manual clock
(pure: no broker, no sleeps): a run the ledger dispatches is placed on the live worker
with a seal only the nodes' key makes, and once that worker falls silent the detector
declares the attempt it held lost, not a moment before its verdict time."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from schemas.codec import HEARTBEAT, JOB_LOG, WORKER_INBOX
from schemas.records import (
    Heartbeat,
    JobUpserted,
    RunningAttempt,
    RunNowRequested,
    WorkerAssignment,
    WorkerCapacity,
    WorkerLost,
)
from schemas.spec import JobSpec
from streams import dispatcher_heartbeats
from streams import ledger as ledger_module
from streams.core.clock import ManualClock
from streams.core.ledger import LedgerConfig
from streams.core.seals import sealed
from streams.core.timing import TIMING
from streams.dispatcher import Dispatcher
from streams.dispatcher_heartbeats import LIST_EVERY_S, LONG_LIST, start_bound
from streams.dispatcher_kernel import DispatcherConfig
from streams.kafka import partition_for, producer_config
from streams.ledger import Ledger
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=2, topic_prefix="disp.")
CONFIG = DispatcherConfig()


def _loops_with_a_run_now(
    clock: ManualClock, clients: MemoryClients, outside: Any
) -> tuple[Dispatcher, Ledger]:
    """A dispatcher and a ledger, open, and a job with a run requested now."""
    dispatcher = Dispatcher(SETTINGS, "d1", CONFIG, clock=clock, clients=clients)
    assert dispatcher.open()
    ledger = Ledger(SETTINGS, LedgerConfig(), node_id="L", clients=clients, clock=clock)
    assert ledger.open()
    now = int(clock.time() * 1000)
    spec = JobSpec(job_id="job", owner="o", schedule=None, command=("true",))
    for record in (JobUpserted(spec, now), RunNowRequested("job", "r1", now)):
        outside.produce(SETTINGS.topic("job-log"), key=b"job", value=JOB_LOG.encode(record))
    return dispatcher, ledger


def _in_memory() -> tuple[ManualClock, MemoryLog, MemoryClients, Any]:
    """A manual clock, an in-memory log with the topics, its clients and a producer."""
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_catalogue(SETTINGS)
    clients = MemoryClients(log)
    return clock, log, clients, clients.producer(producer_config(SETTINGS))


def _assignments(log: MemoryLog) -> list[WorkerAssignment]:
    """Every assignment written to the shared worker inbox so far."""
    return [
        m
        for m in (
            WORKER_INBOX.decode(r.value() or b"")
            for r in log.records(SETTINGS.topic("worker-inbox"))
        )
        if isinstance(m, WorkerAssignment)
    ]


def test_a_run_is_placed_on_the_live_worker_and_declared_lost_when_it_falls_silent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)  # real time, not the log's
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    clock, log, clients, outside = _in_memory()

    def now_ms() -> int:
        return int(clock.time() * 1000)

    def beat(running: tuple[RunningAttempt, ...] = (), armed_ms: int | None = None) -> None:
        capacity = WorkerCapacity(4.0, 4096, 0)
        armed = now_ms() + 2000 if armed_ms is None else armed_ms
        record = Heartbeat("w1", now_ms(), capacity, capacity, (), running, armed)
        outside.produce(SETTINGS.topic("heartbeats"), key=b"w1", value=HEARTBEAT.encode(record))

    dispatcher, ledger = _loops_with_a_run_now(clock, clients, outside)

    assignments: list[WorkerAssignment] = []
    beaten = -TIMING.heartbeat_s
    for _ in range(200):  # the worker beats every second; the loops turn meanwhile
        if clock.monotonic() - beaten >= TIMING.heartbeat_s:
            beaten = clock.monotonic()
            beat()
        ledger.step()
        dispatcher.step()
        assignments = _assignments(log)
        if assignments:
            break
    assert len(assignments) == 1, "the run was not placed"
    placed = assignments[0]
    key = log.records(SETTINGS.topic("node-keys"))[0].value() or b""
    d = placed.dispatch
    assert placed.worker_id == "w1"
    assert sealed(key, d.placement, d.run_id, d.attempt, "w1")

    # The worker lists the attempt, then falls silent: the detector's verdict comes after
    # `dead_after` on the dispatcher's clock, not before.
    # Its last two beats armed starts up to a horizon, the later one from a clock that
    # reads earlier (a restarted incarnation): the verdict names the higher.
    armed = now_ms() + 2000
    beat((RunningAttempt(d.run_id, d.attempt),), armed)
    beat((RunningAttempt(d.run_id, d.attempt),), armed - 500)
    silent_since = clock.monotonic()
    dead_after = CONFIG.dead_after_s
    lost: list[tuple[float, WorkerLost]] = []
    while clock.monotonic() - silent_since < 3 * dead_after and not lost:
        dispatcher.step()
        lost = [
            (clock.monotonic() - silent_since, r)
            for r in (
                JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log"))
            )
            if isinstance(r, WorkerLost)
        ]
    assert lost, "the silent worker was never declared dead"
    after, verdict = lost[0]
    assert (verdict.run_id, verdict.attempt, verdict.worker_id) == (d.run_id, d.attempt, "w1")
    # Judged from the receipt of the last beat (read after `silent_since`), and promptly.
    assert dead_after <= after < dead_after + 1.0
    # A start time after the highest horizon armed was never started (not the lease's
    # bound: the worker starts only what an acknowledged beat armed).
    assert verdict.lease_ended_ms == armed


def test_a_silent_workers_unclaimed_placements_go_elsewhere_at_suspicion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run placed on a worker that falls silent before claiming it is placed on
    another worker once the first is suspected (seconds), not at the ledger's 30 s claim
    deadline; the verdict that follows bounds the silent worker's lease by the broker's
    time of its last beat."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    clock, log, clients, outside = _in_memory()
    last_beat_ms: dict[str, int] = {}

    def now_ms() -> int:
        return int(clock.time() * 1000)

    def beat(worker: str) -> None:
        capacity = WorkerCapacity(4.0, 4096, 0)
        last_beat_ms[worker] = now_ms()
        record = Heartbeat(worker, now_ms(), capacity, capacity, (), ())
        outside.produce(
            SETTINGS.topic("heartbeats"), key=worker.encode(), value=HEARTBEAT.encode(record)
        )

    dispatcher, ledger = _loops_with_a_run_now(clock, clients, outside)

    silent: str | None = None
    silent_since = 0.0
    beaten = -TIMING.heartbeat_s
    placed: list[WorkerAssignment] = []
    for _ in range(2000):
        if clock.monotonic() - beaten >= TIMING.heartbeat_s:
            beaten = clock.monotonic()
            for worker in ("w1", "w2"):
                if worker != silent:
                    beat(worker)
        ledger.step()
        dispatcher.step()
        placed = _assignments(log)
        if silent is None and placed:
            silent, silent_since = placed[0].worker_id, clock.monotonic()
        if len(placed) >= 2:
            break
    assert silent is not None, "the run was not placed"
    assert len(placed) == 2, "the silent worker's placement was never placed again"
    other = "w2" if silent == "w1" else "w1"
    by_worker = {a.worker_id: a.dispatch for a in placed}  # the log's order is per partition
    assert set(by_worker) == {silent, other}
    first = by_worker[silent]
    assert (by_worker[other].run_id, by_worker[other].attempt) == (first.run_id, first.attempt)
    again_after = clock.monotonic() - silent_since
    # Placed again once suspected (no beat for suspect_after_s), long before the verdict.
    assert CONFIG.suspect_after_s <= again_after < CONFIG.suspect_after_s + 2 * TIMING.heartbeat_s

    lost: list[WorkerLost] = []
    while clock.monotonic() - silent_since < 3 * CONFIG.dead_after_s and not lost:
        if clock.monotonic() - beaten >= TIMING.heartbeat_s:
            beaten = clock.monotonic()
            beat(other)
        dispatcher.step()
        lost = [
            r
            for r in (
                JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log"))
            )
            if isinstance(r, WorkerLost)
        ]
    assert [(v.worker_id, v.run_id) for v in lost] == [(silent, first.run_id)]
    # The lease ended by the broker's time of the last beat read plus lease and margin.
    assert lost[0].lease_ended_ms == last_beat_ms[silent] + CONFIG.lease_bound_ms


def test_no_worker_is_declared_dead_for_the_brokers_own_outage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the broker cannot say where the heartbeat partitions end, no beat can be
    read either: a worker silent through the outage that beats again within a second of
    its end is not declared dead, though it was silent far longer than dead_after."""
    clock, log, clients, outside = _in_memory()
    down = [False]

    def broker(call: str, client: object) -> None:
        if down[0] and call == "get_watermark_offsets":
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))

    log.faults.append(broker)

    def beat() -> None:
        capacity = WorkerCapacity(4.0, 4096, 0)
        record = Heartbeat("w1", int(clock.time() * 1000), capacity, capacity, (), ())
        outside.produce(SETTINGS.topic("heartbeats"), key=b"w1", value=HEARTBEAT.encode(record))

    dispatcher = Dispatcher(SETTINGS, "d1", CONFIG, clock=clock, clients=clients)
    assert dispatcher.open()
    started = clock.monotonic()
    while clock.monotonic() - started < 2 * CONFIG.dead_after_s:  # beating, reading
        beat()
        dispatcher.step()
        clock.advance(TIMING.heartbeat_s)
    down[0] = True
    outage = clock.monotonic()
    while clock.monotonic() - outage < 3 * CONFIG.dead_after_s:  # the broker is down
        dispatcher.step()
        clock.advance(0.1)
    down[0] = False
    back = clock.monotonic()
    while clock.monotonic() - back < 2 * CONFIG.dead_after_s:  # beats a second after
        if clock.monotonic() - back >= TIMING.heartbeat_s:
            beat()
        dispatcher.step()
        clock.advance(0.1)
    verdicts = [
        r
        for r in (JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log")))
        if isinstance(r, WorkerLost)
    ]
    assert dispatcher.declared_dead == 0
    assert verdicts == []
    # Silent with the broker up, the same worker is declared dead as before.
    silent = clock.monotonic()
    while clock.monotonic() - silent < 2 * CONFIG.dead_after_s and not dispatcher.declared_dead:
        dispatcher.step()
        clock.advance(0.1)
    assert dispatcher.declared_dead == 1


def test_a_beat_forged_in_a_workers_name_cannot_silence_it() -> None:
    """Another worker principal writes one beat in w1's name, stamped ten years ahead, to
    the heartbeat partition w1 does not use: w1's real beats after it still count (they
    are ordered by the broker's append time, not by the stamp), so w1 is never declared
    dead while it beats."""
    clock, log, clients, outside = _in_memory()
    capacity = WorkerCapacity(4.0, 4096, 0)
    own = partition_for("w1", SETTINGS.partitions)

    def beat(at_ms: int, partition: int = -1) -> None:
        record = Heartbeat("w1", at_ms, capacity, capacity, (), ())
        outside.produce(
            SETTINGS.topic("heartbeats"),
            key=b"w1",
            value=HEARTBEAT.encode(record),
            partition=partition,
        )

    dispatcher = Dispatcher(SETTINGS, "d1", CONFIG, clock=clock, clients=clients)
    assert dispatcher.open()
    started = clock.monotonic()
    forged = False
    while clock.monotonic() - started < 4 * CONFIG.dead_after_s:
        now_ms = int(clock.time() * 1000)
        beat(now_ms)
        if not forged and clock.monotonic() - started > CONFIG.dead_after_s:
            beat(now_ms + 10 * 365 * 86_400_000, partition=1 - own)
            forged = True
        dispatcher.step()
        clock.advance(TIMING.heartbeat_s)
    verdicts = [
        r
        for r in (JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log")))
        if isinstance(r, WorkerLost)
    ]
    assert forged
    assert dispatcher.declared_dead == 0
    assert verdicts == []


def test_an_assignment_is_kept_for_its_reservations_time_and_no_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the dispatcher placed is remembered (for the worker's releases) for
    `reservation_ms` from its latest placement: a run placed again is kept from then,
    though it was first placed before one that is forgotten earlier."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    clock, _, clients, outside = _in_memory()
    dispatcher, ledger = _loops_with_a_run_now(clock, clients, outside)
    beaten = -TIMING.heartbeat_s
    r1, r2 = "job@manual:r1", "job@manual:r2"

    def turn(with_ledger: bool = True) -> None:
        nonlocal beaten
        if clock.monotonic() - beaten >= TIMING.heartbeat_s:
            beaten = clock.monotonic()
            now = int(clock.time() * 1000)
            capacity = WorkerCapacity(4.0, 4096, 0)
            beat = Heartbeat("w1", now, capacity, capacity, (), ())
            outside.produce(SETTINGS.topic("heartbeats"), key=b"w1", value=HEARTBEAT.encode(beat))
        if with_ledger:
            ledger.step()
        dispatcher.step()

    def placed(run_id: str, after_ms: int = -1) -> float:
        """Turns until `run_id` is assigned after `after_ms`: the time (s) it was."""
        for _ in range(200):
            found = dispatcher.assigned.get((run_id, 1))
            if found is not None and found[2] > after_ms:
                return found[2] / 1000
            clock.advance(0.5)
            turn()
        raise AssertionError(f"{run_id} was never placed")

    def until(t: float) -> None:
        """Time passes to `t`; the ledger stays still (nothing is dispatched again)."""
        while clock.time() < t:
            clock.advance(min(0.5, t - clock.time()))
            turn(with_ledger=False)

    def kept() -> set[str]:
        return {run_id for run_id, _ in dispatcher.assigned}

    first = placed(r1)
    clock.advance(10)
    now = int(clock.time() * 1000)
    request = JOB_LOG.encode(RunNowRequested("job", "r2", now))
    outside.produce(SETTINGS.topic("job-log"), key=b"job", value=request)
    second = placed(r2)
    # Nobody claims r1: at its claim deadline the ledger dispatches it again.
    again = placed(r1, after_ms=int(first * 1000))
    assert first < second < again
    reservation_s = CONFIG.reservation_ms / 1000
    until(second + reservation_s - 0.5)
    assert kept() == {r1, r2}
    until(second + reservation_s + 0.5)
    assert kept() == {r1}
    until(again + reservation_s + 0.5)
    assert kept() == set()


def test_a_long_list_is_read_now_and_then_and_a_verdict_names_the_newest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker holding a burst lists thousands of attempts a beat. The dispatcher reads
    such a list at most every LIST_EVERY_S (the beats between count for liveness and
    capacity at once); should the worker fall silent, the verdict still names exactly
    the attempts its newest beat listed, not those of the last list it read."""
    clock, log, clients, outside = _in_memory()
    capacity = WorkerCapacity(4.0, 4096, 0)
    skimmed: list[bytes] = []
    decode_without = HEARTBEAT.decode_without

    def counted(data: bytes, field: str) -> Heartbeat:
        skimmed.append(data)
        return decode_without(data, field)

    monkeypatch.setattr(HEARTBEAT, "decode_without", counted)

    def beat(held: tuple[RunningAttempt, ...]) -> None:
        record = Heartbeat("w1", int(clock.time() * 1000), capacity, capacity, (), held)
        outside.produce(SETTINGS.topic("heartbeats"), key=b"w1", value=HEARTBEAT.encode(record))

    first = tuple(RunningAttempt(f"job-a#{i}", 1) for i in range(2 * LONG_LIST))
    newest = tuple(RunningAttempt(f"job-b#{i}", 1) for i in range(2 * LONG_LIST))
    dispatcher = Dispatcher(SETTINGS, "d1", CONFIG, clock=clock, clients=clients)
    assert dispatcher.open()
    beat(first)
    dispatcher.step()
    assert skimmed == []  # the first beat of a worker is read whole
    clock.advance(TIMING.heartbeat_s)
    beat(newest)
    dispatcher.step()
    assert len(skimmed) == 1  # within LIST_EVERY_S of the list read: skimmed
    assert TIMING.heartbeat_s < LIST_EVERY_S
    silent_since = clock.monotonic()
    lost: list[WorkerLost] = []
    while clock.monotonic() - silent_since < 3 * CONFIG.dead_after_s and not lost:
        dispatcher.step()
        clock.advance(0.5)
        lost = [
            r
            for r in (
                JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log"))
            )
            if isinstance(r, WorkerLost)
        ]
    assert dispatcher.declared_dead == 1
    assert sorted((r.run_id, r.attempt) for r in lost) == sorted(
        (a.run_id, a.attempt) for a in newest
    )


def test_a_placement_listed_by_a_skimmed_beat_is_not_taken_back_at_suspicion(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker holding a long list claims a run and lists it in beats the dispatcher
    reads without their lists, then falls silent. At suspicion its placements nobody
    listed are placed again elsewhere; this one was listed (the newest beat says so), so
    it is not, and the verdict names it."""
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    monkeypatch.setattr(dispatcher_heartbeats, "LIST_EVERY_S", 600.0)  # every list skimmed
    clock, log, clients, outside = _in_memory()
    capacity = WorkerCapacity(4.0, 4096, 0)
    filler = tuple(RunningAttempt(f"other#{i}", 1) for i in range(LONG_LIST))

    def beat(worker: str, held: tuple[RunningAttempt, ...]) -> None:
        record = Heartbeat(worker, int(clock.time() * 1000), capacity, capacity, (), held)
        outside.produce(
            SETTINGS.topic("heartbeats"), key=worker.encode(), value=HEARTBEAT.encode(record)
        )

    dispatcher, ledger = _loops_with_a_run_now(clock, clients, outside)
    held = filler
    beaten = -TIMING.heartbeat_s
    for _ in range(2000):  # only w1 beats: the run goes there
        if clock.monotonic() - beaten >= TIMING.heartbeat_s:
            beaten = clock.monotonic()
            beat("w1", held)
        ledger.step()
        dispatcher.step()
        if _assignments(log):
            break
    [placed] = _assignments(log)
    assert placed.worker_id == "w1"
    d = placed.dispatch
    held = (*filler, RunningAttempt(d.run_id, d.attempt))  # claimed: listed from now on
    for _ in range(2):
        clock.advance(TIMING.heartbeat_s)
        beat("w1", held)
        dispatcher.step()
    assert dispatcher.workers["w1"].unlisted  # its newest beat was read without the list
    silent_since = clock.monotonic()
    lost: list[WorkerLost] = []
    while clock.monotonic() - silent_since < 3 * CONFIG.dead_after_s and not lost:
        if clock.monotonic() - beaten >= TIMING.heartbeat_s:
            beaten = clock.monotonic()
            beat("w2", ())
        dispatcher.step()
        clock.advance(0.25)
        lost = [
            r
            for r in (
                JOB_LOG.decode(m.value() or b"") for m in log.records(SETTINGS.topic("job-log"))
            )
            if isinstance(r, WorkerLost)
        ]
    assert clock.monotonic() - silent_since > CONFIG.suspect_after_s
    assert [a.worker_id for a in _assignments(log)] == ["w1"]  # never placed again
    assert (d.run_id, d.attempt) in {(r.run_id, r.attempt) for r in lost}


def test_a_start_bound_is_the_highest_horizon_or_a_lease_without_one() -> None:
    lease = CONFIG.lease_bound_ms
    assert start_bound(None, 5_000, 1_000, lease) == 5_000
    assert start_bound(7_000, 5_000, 1_000, lease) == 7_000  # never lowered
    # A worker from before arming: its beat's broker time plus the lease bounds it.
    assert start_bound(None, None, 1_000, lease) == 1_000 + lease
    assert start_bound(1_500, None, 1_000, lease) == 1_000 + lease
    assert start_bound(None, None, None, lease) is None
    assert start_bound(7_000, None, None, lease) == 7_000  # nothing new: the known bound
