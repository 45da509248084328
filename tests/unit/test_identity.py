"""One live ledger per node id (streams/identity.py), over the in-memory Kafka: a second
process under a live node id refuses to start; a ledger frozen past its session, replaced
by a restart under its id, is fenced when it wakes and stops instead of fencing back (the
livelock in which almost nothing committed); the replacement goes on deciding."""

from __future__ import annotations

import pytest

from schemas.codec import JOB_LOG, RUN_EVENTS
from schemas.records import JobUpserted, RunEvent
from schemas.spec import EverySchedule, JobSpec
from streams import ledger as ledger_module
from streams.core.clock import ManualClock
from streams.core.ledger import LedgerConfig
from streams.core.timing import TIMING
from streams.identity import (
    NodeIdTaken,
    ledger_client_id,
    new_incarnation,
    parse_client_id,
    twins,
)
from streams.kafka import producer_config
from streams.ledger import Ledger
from streams.memory import MemoryClients
from streams.memory_log import MemoryLog
from streams.settings import Settings

SETTINGS = Settings(partitions=2, topic_prefix="identity.")


def test_a_client_id_names_the_incarnation_and_the_node_id() -> None:
    older, newer = new_incarnation(), new_incarnation()
    assert len(older) == len(newer) == 15
    assert older[:11] <= newer[:11]  # started no later: sorts no higher
    cid = ledger_client_id(2, "a1b2c3d4e5f6", "node.with.dots")
    assert cid.startswith("cronlog-ledger-002.")  # the range assignor's order stays
    assert parse_client_id(cid) == ("a1b2c3d4e5f6", "node.with.dots")
    assert parse_client_id("rdkafka") is None
    members = [(cid, "h1"), (ledger_client_id(0, "ffffffffffff", "node.with.dots"), "h2")]
    assert twins(members, "node.with.dots", "a1b2c3d4e5f6") == ["incarnation ffffffffffff on h2"]
    assert twins(members, "node.with.dots", "a1b2c3d4e5f6", newer=True) == [
        "incarnation ffffffffffff on h2"
    ]
    assert twins(members, "node.with.dots", "ffffffffffff", newer=True) == []
    assert twins(members, "other", "a1b2c3d4e5f6") == []


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> tuple[ManualClock, MemoryLog, MemoryClients]:
    monkeypatch.setattr(ledger_module, "TXN_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "OFFSETS_WATCHDOG_S", 600.0)
    monkeypatch.setattr(ledger_module, "TWIN_PATIENCE_S", 0.3)
    clock = ManualClock()
    log = MemoryLog(clock)
    log.create_catalogue(SETTINGS)
    return clock, log, MemoryClients(log)


def _ledger(clock: ManualClock, clients: MemoryClients) -> Ledger:
    node = Ledger(SETTINGS, LedgerConfig(), node_id="L", clients=clients, clock=clock)
    assert node.open()
    return node


def _register(clock: ManualClock, clients: MemoryClients, job_id: str) -> None:
    spec = JobSpec(job_id=job_id, owner="o", schedule=EverySchedule(60_000), command=("true",))
    producer = clients.producer(producer_config(SETTINGS))
    upsert = JobUpserted(spec, int(clock.time() * 1000))
    producer.produce(SETTINGS.topic("job-log"), key=job_id.encode(), value=JOB_LOG.encode(upsert))


def _registered(log: MemoryLog) -> set[str]:
    events = [
        RUN_EVENTS.decode(m.value() or b"") for m in log.records(SETTINGS.topic("run-events"))
    ]
    return {e.job_id for e in events if not isinstance(e, RunEvent)}


def test_a_second_process_under_a_live_node_id_refuses_to_start(
    world: tuple[ManualClock, MemoryLog, MemoryClients],
) -> None:
    clock, log, clients = world
    first = _ledger(clock, clients)
    first.step()
    with pytest.raises(NodeIdTaken, match="node id 'L' is held by a live ledger"):
        Ledger(SETTINGS, LedgerConfig(), node_id="L", clients=clients, clock=clock)
    _register(clock, clients, "after")
    for _ in range(5):
        first.step()
    assert "after" in _registered(log)  # the first was not fenced: it still decides


def test_a_frozen_ledger_replaced_under_its_id_stops_when_it_wakes(
    world: tuple[ManualClock, MemoryLog, MemoryClients],
) -> None:
    clock, log, clients = world
    frozen = _ledger(clock, clients)
    _register(clock, clients, "before")
    for _ in range(5):
        frozen.step()
    assert "before" in _registered(log)
    clock.advance(TIMING.consumer_session_s + 1)  # frozen past its session
    replacement = _ledger(clock, clients)  # the restart under the fixed id
    for n in range(3):
        _register(clock, clients, f"during{n}")
        replacement.step()
    _register(clock, clients, "wake")

    def wake() -> None:  # it rejoins, is given partitions, and sees its replacement
        for _ in range(20):
            frozen.step()

    with pytest.raises(NodeIdTaken, match="was replaced by a live ledger under its node id"):
        wake()
    clock.advance(TIMING.consumer_session_s + 1)  # the stopped one leaves the group
    for n in range(3):
        _register(clock, clients, f"later{n}")
    for _ in range(10):
        replacement.step()
    assert {"during0", "during2", "wake", "later2"} <= _registered(log)
