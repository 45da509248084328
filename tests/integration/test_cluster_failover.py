"""Broker failures on a replicated cluster, under load.

A private three-broker KRaft cluster (tests/support/cluster.py), the contract's topics
with 3 replicas and min ISR 2, two scheduler nodes, two real workers and jobs firing
every second. Then, one after the other:

1. kill -9 the broker leading the most cronlog partitions, restart it 15 s later;
2. kill -9 another broker (the busiest of the other two), restart it;
3. a controlled rolling restart of all three (SIGTERM, start, wait until in sync).

During the faults manual runs are requested (each acknowledged by the cluster). The
acceptance: no acknowledged command lost, no duplicate run, no missed firing, every run
final and succeeded, the audit of the whole log clean. The start lateness around each
fault is printed (the figures of the issue note). `make chaos` runs it
(CRONLOG_LONG_TESTS=1) and `python -m bench.chaos`, ten minutes of random faults; `make
test` has a broker's death on three brokers in tests/integration/test_production_faults.py
(with manual runs requested during the failover, long jobs and a worker lost for good).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from streams.settings import Settings
from tests.support.cluster import ClusterWorld, cluster_world
from tests.support.firings import (
    assert_audit_clean,
    check_firings,
    pause_and_settle,
    start_lateness,
)
from tests.support.nodes import EventReader, Node, WorkerProc, deaths, job, send_commands, stop_all

JOBS = 8
EVERY_S = 1
DOWN_S = 15  # how long a killed broker stays down
# How long after a fault its runs are counted as "during the failover".
WINDOW_MS = 30_000


World = ClusterWorld


@pytest.fixture
def world(settings: Settings, tmp_path: Path) -> Iterator[World]:
    with cluster_world(settings, tmp_path) as made:
        yield made


@pytest.mark.long
def test_broker_kills_and_a_rolling_restart_lose_and_double_nothing(world: World) -> None:
    s, cluster = world.settings, world.cluster
    prefix = s.topic_prefix
    nodes = [Node(s, f"cf-n{i}", world.logs).start() for i in (1, 2)]
    workers = [WorkerProc(s, f"cf-w{i}", world.logs, cpu=8).start() for i in (1, 2)]
    events = EventReader(s, "cluster-failover-check")
    ids = [f"cf-{i:02d}" for i in range(JOBS)]
    manual: list[str] = []
    figures: dict[str, str] = {}
    faults: list[tuple[str, int]] = []

    def request_manual_runs(tag: str) -> None:
        # Acknowledged by the cluster (send_commands flushes and asserts), mid-fault.
        requests = [f"{tag}-{i}" for i in range(3)]
        send_commands(
            s,
            [
                {"type": "job.run_now", "job_id": ids[i], "request_id": r}
                for i, r in enumerate(requests)
            ],
        )
        manual.extend(f"{ids[i]}@manual:{r}" for i, r in enumerate(requests))

    try:
        send_commands(
            s, [job(j, ["true"], schedule={"every": f"{EVERY_S}s"}, idempotent=True) for j in ids]
        )
        events.wait_until(
            lambda: (
                {e.job_id for e, _ in events.run_events() if e.state == "succeeded"} >= set(ids)
            ),
            180,
            "every job's first run",
        )
        events.poll_for(10)

        # 1. the busiest leader crashes, comes back 15 s later
        first = cluster.busiest_leader(prefix)
        print(f"leaders before kill 1: {dict(cluster.leaders(prefix))}; killing broker {first}")
        faults.append((f"kill -9 broker {first} (busiest leader)", int(time.time() * 1000)))
        cluster.kill(first)
        request_manual_runs("k1")
        events.poll_for(DOWN_S)
        cluster.start(first)
        print(f"broker {first} back in sync after {cluster.wait_in_sync(prefix):.1f} s")
        events.poll_for(15)

        steps_done = 3
        _second_kill_and_rolling_restart(world, first, events, request_manual_runs, faults)

        dead = deaths([*nodes, *workers])
        pause_and_settle(s, events, ids)
    finally:
        events.close()
        stop_all((*nodes, *workers))

    for (what, at_ms), end_ms in zip(
        faults, [*(t for _, t in faults[1:]), faults[-1][1] + 120_000], strict=True
    ):
        figures[what] = str(start_lateness(events, at_ms - 2000, min(end_ms, at_ms + WINDOW_MS)))
    # The 10 s before the first fault, after every job's first run: the baseline.
    calm = start_lateness(events, faults[0][1] - 12_000, faults[0][1] - 2000)
    print(f"calm before the faults: {calm}")
    for what, figure in figures.items():
        print(f"{what}: {figure}")

    assert not dead, f"a process died on its own:\n{dead}"
    verdict = check_firings(events, ids, EVERY_S * 1000, manual)
    print("verdict:", verdict.summary())
    assert verdict.firings_checked > JOBS * 20 * steps_done
    assert verdict.lost_commands == []
    assert verdict.duplicates == []
    assert verdict.missed == [], verdict.missed[:5]
    assert verdict.not_final == []
    assert verdict.not_succeeded == {}, list(verdict.not_succeeded.items())[:5]

    assert_audit_clean(s)


def _second_kill_and_rolling_restart(
    world: World,
    first: int,
    events: EventReader,
    request_manual_runs: Callable[[str], None],
    faults: list[tuple[str, int]],
) -> None:
    """The long version's steps 2 and 3: kill -9 another broker, then a controlled rolling
    restart of all three."""
    s, cluster = world.settings, world.cluster
    prefix = s.topic_prefix
    # 2. another broker crashes
    second = cluster.busiest_leader(prefix, [n for n in cluster.node_ids if n != first])
    print(f"leaders before kill 2: {dict(cluster.leaders(prefix))}; killing broker {second}")
    faults.append((f"kill -9 broker {second}", int(time.time() * 1000)))
    cluster.kill(second)
    request_manual_runs("k2")
    events.poll_for(DOWN_S)
    cluster.start(second)
    print(f"broker {second} back in sync after {cluster.wait_in_sync(prefix):.1f} s")
    events.poll_for(15)

    # 3. a controlled rolling restart
    faults.append(("rolling restart", int(time.time() * 1000)))
    for node_id in cluster.node_ids:
        cluster.stop(node_id)
        request_manual_runs(f"r{node_id}")
        cluster.start(node_id)
        cluster.wait_in_sync(prefix)
        events.poll_for(3)
    events.poll_for(15)
