"""Dependencies end to end: upstream `a` fires every 2 s; `b` (same schedule) and the DAG
step `c` (no schedule) depend on it. The test plays a worker for `a` through the real log
(claims, sealed as the dispatcher would, and reports on job-log, exactly what a worker
sends), succeeding on some periods
and failing on others; the ledger must release `b` and `c` for the good periods and skip
them, with a reason, for the bad ones."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer

from schemas.codec import DISPATCH, JOB_LOG
from schemas.records import ClaimRequested, RunFinished, RunStarted
from streams.core.seals import seal
from streams.kafka import consumer_config, producer_config
from streams.placement_key import placement_key
from streams.settings import Settings
from tests.support.nodes import EventReader, Node, send_commands


@pytest.fixture(scope="module")
def node(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    started = Node(topics, "deps-n1", tmp_path_factory.mktemp("nodes")).start()
    yield started
    started.stop()


def good_period(scheduled_ms: int) -> bool:
    return scheduled_ms % 4000 == 0


def play_worker_for_a(settings: Settings, seconds: float) -> set[int]:
    """Claim, start and finish every run of `a`; returns the periods that succeeded.
    Reading `dispatch`, it plays the dispatcher too: it seals its placement on w1 with
    the nodes' key, or the ledger would grant it no claim and take no report."""
    key = placement_key(settings)
    dispatch = Consumer(consumer_config(settings, settings.group("w")))
    dispatch.subscribe([settings.topic("dispatch")])
    producer = Producer(producer_config(settings))
    succeeded: set[int] = set()
    done: set[str] = set()
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            for msg in dispatch.consume(100, timeout=0.3):
                if msg.error() is not None:
                    continue
                request = DISPATCH.decode(msg.value() or b"")
                if request.job_id != "a" or request.run_id in done:
                    continue
                done.add(request.run_id)
                now = int(time.time() * 1000)
                ok = good_period(request.scheduled_ms)
                code = 0 if ok else 1
                mark = seal(key, request.run_id, request.attempt, "w1")
                run_id, attempt = request.run_id, request.attempt
                for record in (
                    ClaimRequested("a", run_id, attempt, "w1", now, mark),
                    RunStarted("a", run_id, attempt, "w1", now + 1, mark),
                    RunFinished("a", run_id, attempt, "w1", code, "", now + 2, mark),
                ):
                    producer.produce(
                        settings.topic("job-log"), key=b"a", value=JOB_LOG.encode(record)
                    )
                producer.flush(10)
                if ok:
                    succeeded.add(request.scheduled_ms)
    finally:
        dispatch.close()
    return succeeded


def test_downstreams_follow_their_upstreams_outcome(topics: Settings, node: Node) -> None:
    send_commands(
        topics,
        [
            {
                "type": "job.upsert",
                "job_id": "a",
                "owner": "t",
                "schedule": {"every": "2s"},
                "command": ["true"],
            },
            {
                "type": "job.upsert",
                "job_id": "b",
                "owner": "t",
                "schedule": {"every": "2s"},
                "command": ["true"],
                "depends_on": ["a"],
            },
            {
                "type": "job.upsert",
                "job_id": "c",
                "owner": "t",
                "command": ["true"],
                "depends_on": ["a"],
            },
        ],
    )
    succeeded = play_worker_for_a(topics, 20)
    assert len(succeeded) >= 3

    events = EventReader(topics, "deps-check")
    try:
        # a's outcomes decided and read; then the notices they sent b and c (written to
        # job-log in the same transactions, so before the second look at its ends).
        events.settle()
        events.settle()
        runs = events.run_events()
    finally:
        events.close()
    a_final = {
        e.scheduled_ms: e.state
        for e, _ in runs
        if e.job_id == "a" and e.state in ("succeeded", "failed")
    }
    states: dict[tuple[str, int], list[str]] = {}
    reasons: dict[tuple[str, int], str] = {}
    for event, _ in runs:
        if event.job_id in ("b", "c"):
            states.setdefault((event.job_id, event.scheduled_ms), []).append(event.state)
            reasons[(event.job_id, event.scheduled_ms)] = event.reason
    # c (a step without a schedule) hears of a's outcomes only once its link reached a's
    # ledger (a notice through job-log, after c's registration): a's periods decided
    # before that have no record of c. From its first period on, every one has.
    c_first = min((t for job, t in states if job == "c"), default=None)
    assert c_first is not None, "c never heard of a"
    checked = 0
    for t, outcome in a_final.items():
        if ("b", t) not in states or t < c_first:
            continue  # b registered, or c's link landed, after a's first runs
        checked += 1
        if outcome == "succeeded":
            assert states[("b", t)] == ["waiting", "due"], (t, states[("b", t)])
            assert states[("c", t)] == ["due"]
        else:
            assert states[("b", t)] == ["waiting", "skipped"]
            assert reasons[("b", t)] == "upstream a did not succeed"
            assert states[("c", t)] == ["skipped"]
    assert checked >= 6
    assert {"succeeded", "failed"} <= set(a_final.values())
    assert Path(node.log).exists()
