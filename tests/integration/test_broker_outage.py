"""The broker crashes (SIGKILL) under load and comes back: the scheduler nodes ride it out.

A private single-node broker (tests/support/broker.py), real scheduler nodes and two
real workers, jobs firing every second. The broker is killed with SIGKILL and restarted
on the same data, after 20 s in one test and after 2 minutes in the other, each with a
second node started while it is down, which must wait for it rather than exit. Both are
long scenarios (`make chaos` runs them); the suite's short version is
tests/integration/test_edge_outage.py (every process, one node and a second one started
during a 15 s outage, one run per firing, the audit clean). Then:
firing resumes within a generous bound of the broker's return (the figure is printed),
no (job, scheduled time) has two runs, every firing in the window left a run event (run,
or skipped per the job's misfire policy: never silently absent), every run reaches a
final state, and the audit of the whole log is clean.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from schemas.spec import EverySchedule
from streams.core.schedule import fires_between
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.broker import PrivateBroker, private_broker
from tests.support.cluster import on_brokers
from tests.support.firings import assert_audit_clean, first_start_after
from tests.support.nodes import (
    EventReader,
    Node,
    WorkerProc,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)

JOBS = 12
EVERY_S = 1
FINALS = ("succeeded", "failed", "cancelled", "skipped")
# Acceptance bound on behaviour, generous: the first run started after the broker is back.
RESUME_BOUND_S = 30.0


@dataclass
class Outage:
    broker: PrivateBroker
    settings: Settings
    logs: Path
    nodes: list[Node]


@pytest.fixture(scope="module")
def outage(settings: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outage]:
    """A private broker with the contract's topics, under this module's prefix and
    database (the shared broker of the suite must never go down), one scheduler node and
    two real workers, shared by the tests of the module (each with jobs of its own)."""
    tmp = tmp_path_factory.mktemp("outage")
    with private_broker(tmp) as broker:
        private = on_brokers(settings, broker.bootstrap)
        ensure_topics(private)
        logs = tmp / "logs"
        logs.mkdir()
        outage = Outage(broker, private, logs, [Node(private, "n1", logs).start()])
        workers = [
            WorkerProc(private, f"w{i}", logs, cpu=8, memory_mb=4096).start() for i in (1, 2)
        ]
        try:
            yield outage
        finally:
            stop_all([*outage.nodes, *workers])


def _ride_out(outage: Outage, down_s: float, late_node: bool, tag: str) -> None:
    s = outage.settings
    nodes = outage.nodes
    events = EventReader(s, f"{tag}-check")
    names = [f"{tag}-job-{i:02d}" for i in range(JOBS)]

    def mine(job_id: str) -> bool:
        return job_id.startswith(f"{tag}-")

    try:
        send_commands(s, [job(n, ["true"], schedule={"every": f"{EVERY_S}s"}) for n in names])
        events.wait_until(
            lambda: (
                sum(e.state == "succeeded" and mine(e.job_id) for e, _ in events.run_events())
                >= JOBS
            ),
            120,
            "the first runs",
        )
        events.poll_for(4)

        outage.broker.kill()
        killed_ms = int(time.time() * 1000)
        if late_node:
            time.sleep(2)
            nodes.append(Node(s, f"{tag}-n2", outage.logs).start())  # stopped by the fixture
        time.sleep(max(0.0, killed_ms / 1000 + down_s - time.time()))
        assert all(n.alive for n in nodes), "a node exited while the broker was down"
        if late_node:
            said = (outage.logs / f"{tag}-n2.log").read_text()
            assert "waiting for the broker" in said, said[-2000:]
        outage.broker.start()
        back_ms = int(time.time() * 1000)

        events.wait_until(
            lambda: first_start_after(events, back_ms) is not None,
            RESUME_BOUND_S + 30,
            "a run started after the broker's return",
        )
        first = first_start_after(events, back_ms)
        assert first is not None
        resumed_s = (first - back_ms) / 1000
        print(f"broker outage {down_s:.0f} s: first run started {resumed_s:.1f} s after its return")
        # Long enough after the return for firings past the resume bound to be checked.
        events.poll_for(max(5.0, back_ms / 1000 + RESUME_BOUND_S + 6 - time.time()))
        assert all(n.alive for n in nodes), "a node died after the broker's return"
        send_commands(s, [{"type": "job.pause", "job_id": n} for n in names])
        events.wait_until(
            lambda: sum(e.kind == "paused" and mine(e.job_id) for e in events.job_events()) >= JOBS,
            60,
            "every job paused",
        )

        def settled() -> bool:
            runs = runs_by_id(events)
            return bool(runs) and all(evs[-1].state in FINALS for evs in runs.values())

        events.wait_until(settled, 120, "every run final")
        events.poll_for(2)
    finally:
        events.close()

    # -- one run per firing, none silently absent ------------------------------------------
    registered: dict[str, int] = {}
    for e in events.job_events():
        if e.kind == "upserted" and mine(e.job_id):
            registered[e.job_id] = min(e.at_ms, registered.get(e.job_id, e.at_ms))
    paused = {e.job_id: e.at_ms for e in events.job_events() if e.kind == "paused"}
    runs = {r: evs for r, evs in runs_by_id(events).items() if mine(evs[0].job_id)}
    by_time: defaultdict[tuple[str, int], set[str]] = defaultdict(set)
    for run_id, evs in runs.items():
        if evs[0].trigger == "schedule":
            by_time[(evs[0].job_id, evs[0].scheduled_ms)].add(run_id)
    duplicates = [k for k, ids in by_time.items() if len(ids) > 1]
    expected = {
        (job_id, t)
        for job_id, start in registered.items()
        for t in fires_between(EverySchedule(EVERY_S * 1000), start, paused[job_id])
    }
    missed = sorted(expected - set(by_time))
    during = [k for k in expected if killed_ms <= k[1] <= back_ms]
    skipped = [k for k in during if all(e.state == "skipped" for e in runs[next(iter(by_time[k]))])]
    print(
        f"firings checked {len(expected)}, during the outage {len(during)} "
        f"({len(skipped)} skipped by the misfire policy)"
    )
    assert len(during) >= JOBS * (down_s - 2)
    assert duplicates == [], duplicates[:5]
    assert missed == [], missed[:5]
    not_final = [r for r, evs in runs.items() if evs[-1].state not in FINALS]
    assert not_final == []
    assert resumed_s <= RESUME_BOUND_S, f"firing resumed {resumed_s:.1f} s after the return"
    # Runs due after the outage (and its misfire window) ran: the pipeline is whole again.
    after = [k for k in expected if k[1] > back_ms + RESUME_BOUND_S * 1000]
    assert after, "no firing after the broker's return was checked"
    assert all(runs[next(iter(by_time[k]))][-1].state == "succeeded" for k in after)

    # -- the audit ----------------------------------------------------------------------------
    assert_audit_clean(s)


@pytest.mark.long
def test_a_broker_killed_under_load_and_back_in_20_s_with_a_node_started_meanwhile(
    outage: Outage,
) -> None:
    _ride_out(outage, down_s=20, late_node=True, tag="short")


@pytest.mark.long
def test_a_broker_down_for_2_minutes_with_a_node_started_meanwhile(outage: Outage) -> None:
    _ride_out(outage, down_s=120, late_node=True, tag="long")
