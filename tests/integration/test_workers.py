"""Workers on the real broker with real processes: one run per firing across three
workers of different sizes; placement by cpu, memory, gpu and labels; a run no worker
could ever fit fails with the reason; timeouts and cancel kill the process group."""

from __future__ import annotations

import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from schemas.codec import JOB_LOG
from schemas.records import FINAL_STATES, RunEvent, RunFinished, RunStarted
from streams.settings import Settings
from tests.support.kafka import drain
from tests.support.nodes import (
    EventReader,
    Node,
    WorkerProc,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)
from tests.support.waiting import until_passes


@pytest.fixture(scope="module")
def cluster(
    topics: Settings, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Node, list[WorkerProc]]]:
    logs = tmp_path_factory.mktemp("cluster")
    # The limits bound what any heartbeat is believed: `liar` says 64 cpu and a label the
    # operator did not allow (its memory, 32 MB, keeps it out of the other tests' runs).
    limits = {"CRONLOG_WORKER_MAX_CPU": "2", "CRONLOG_WORKER_LABELS": "zone=*"}
    node = Node(topics, "wk-n1", logs, extra_env=limits).start()
    workers = [
        WorkerProc(topics, "small", logs, cpu=1, memory_mb=256).start(),
        WorkerProc(topics, "big", logs, cpu=2, memory_mb=2048, labels=("zone=b",)).start(),
        WorkerProc(topics, "gpu", logs, cpu=1, memory_mb=1024, gpu=1).start(),
        WorkerProc(topics, "liar", logs, cpu=64, memory_mb=32, labels=("rogue=yes",)).start(),
    ]
    yield node, workers
    stop_all([*workers, node])


@pytest.fixture(scope="module")
def events(topics: Settings, cluster: object) -> Iterator[EventReader]:
    reader = EventReader(topics, "workers-check")
    yield reader
    reader.close()


def final_states(events: EventReader, job_id: str) -> dict[str, list[str]]:
    return {
        run_id: [e.state for e in evs]
        for run_id, evs in runs_by_id(events).items()
        if evs[0].job_id == job_id
    }


def wait_final(events: EventReader, job_id: str, count: int, timeout_s: float = 90) -> None:
    events.wait_until(
        lambda: sum(s[-1] in FINAL_STATES for s in final_states(events, job_id).values()) >= count,
        timeout_s,
        f"{count} final runs of {job_id}",
    )


def test_one_run_per_firing_across_three_workers(
    topics: Settings, events: EventReader, tmp_path: Path
) -> None:
    out = tmp_path / "runs.txt"
    send_commands(
        topics,
        [
            job(
                "every2",
                ["sh", "-c", f'echo "$CRONLOG_RUN_ID $CRONLOG_ATTEMPT" >> {out}; sleep 3'],
                schedule={"every": "2s"},
                # Runs of 3 s every 2 s overlap, and two of them do not fit the small
                # worker (reservations are in time: only overlapping runs compete).
                resources={"cpu": 0.6, "memory_mb": 64},
            )
        ],
    )
    events.wait_until(
        lambda: sum(s[-1] == "succeeded" for s in final_states(events, "every2").values()) >= 8,
        90,
        "8 runs of every2 to succeed",
    )
    send_commands(topics, [{"type": "job.pause", "job_id": "every2"}])
    events.wait_until(
        lambda: (
            any(e.kind == "paused" and e.job_id == "every2" for e in events.job_events())
            and all(s[-1] in FINAL_STATES for s in final_states(events, "every2").values())
        ),
        60,
        "the pause, and every run of every2 final",
    )
    states = final_states(events, "every2")
    succeeded = {run for run, s in states.items() if s[-1] == "succeeded"}
    lines = out.read_text().splitlines()
    assert len(lines) == len(set(lines)), "a (run, attempt) ran twice"
    ran = Counter(line.split()[0] for line in lines)
    assert max(ran.values()) == 1
    assert succeeded <= set(ran)  # every success ran exactly once
    # Nothing else ran, except at most the run the pause withdrew as it was starting (its
    # stop order raced the worker's start timer): the ledger recorded its start, then
    # cancelled it for the pause; it never succeeded, and ran once.
    cut_short = set(ran) - succeeded
    assert len(cut_short) <= 1
    for run_id in cut_short:
        path = [e.state for e in runs_by_id(events)[run_id]]
        last = runs_by_id(events)[run_id][-1]
        assert path[-2:] == ["running", "cancelled"], path
        assert last.reason == "job paused before the run was due (it had started)"
    assert len(succeeded) >= 8
    workers = {
        e.worker_id
        for evs in runs_by_id(events).values()
        for e in evs
        if e.job_id == "every2" and e.state == "dispatched"
    }
    assert len(workers) >= 2  # overlapping runs spread over the workers


def test_placement_respects_resources_and_labels(
    topics: Settings, events: EventReader, cluster: tuple[Node, list[WorkerProc]]
) -> None:
    """Also the worker limits: `liar` (64 cpu, label rogue=yes) is believed 2 cpu and no
    label, so neither the 64-cpu run nor the rogue one is placed on it."""
    send_commands(
        topics,
        [
            job("needs-2cpu", ["true"], resources={"cpu": 1.5, "memory_mb": 100}),
            job("needs-zone-b", ["true"], resources={"cpu": 0.1, "labels": {"zone": "b"}}),
            job("needs-gpu", ["true"], resources={"cpu": 0.1, "gpu": 1}),
            job("too-big", ["true"], resources={"cpu": 64}),
            job("needs-rogue", ["true"], resources={"cpu": 0.1, "labels": {"rogue": "yes"}}),
        ],
    )
    events.wait_registered(["needs-2cpu", "needs-zone-b", "needs-gpu", "too-big", "needs-rogue"])
    send_commands(
        topics,
        [
            {"type": "job.run_now", "job_id": jid, "request_id": f"r{i}"}
            for jid in ("needs-2cpu", "needs-zone-b", "needs-gpu", "too-big", "needs-rogue")
            for i in range(3)
        ],
    )
    for jid in ("needs-2cpu", "needs-zone-b", "needs-gpu", "too-big", "needs-rogue"):
        wait_final(events, jid, 3)
    expected = {"needs-2cpu": "big", "needs-zone-b": "big", "needs-gpu": "gpu"}
    for jid, worker in expected.items():
        placed = {
            e.worker_id
            for evs in runs_by_id(events).values()
            for e in evs
            if e.job_id == jid and e.state == "dispatched"
        }
        assert placed == {worker}, jid
        assert all(s[-1] == "succeeded" for s in final_states(events, jid).values()), jid
    for jid in ("too-big", "needs-rogue"):
        ends = [evs[-1] for evs in runs_by_id(events).values() if evs[0].job_id == jid]
        assert len(ends) == 3, jid
        assert {e.state for e in ends} == {"failed"}, jid
        assert all("no worker could ever fit" in e.reason for e in ends), jid
    node_log = cluster[0].log.read_text(errors="replace")
    assert "worker liar offers more than allowed: cpu 64.0 above the limit 2.0" in node_log
    assert "labels rogue=yes not allowed" in node_log


def _alive(marker: str) -> bool:
    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, check=False)
    return found.returncode == 0


def test_timeout_kills_the_group_and_cancel_stops_a_running_run(
    topics: Settings, events: EventReader
) -> None:
    send_commands(
        topics,
        [
            job("slow", ["sh", "-c", "sleep 31.4159 & sleep 31.4159; wait"], timeout_s=2),
            job("cancel-me", ["sleep", "27.1828"], timeout_s=600),
        ],
    )
    events.wait_registered(["slow", "cancel-me"])
    send_commands(
        topics,
        [
            {"type": "job.run_now", "job_id": "slow", "request_id": "t1"},
            {"type": "job.run_now", "job_id": "cancel-me", "request_id": "c1"},
        ],
    )
    events.wait_until(
        lambda: any(s[-1] == "running" for s in final_states(events, "cancel-me").values()),
        60,
        "cancel-me running",
    )
    assert _alive("sleep 27.1828")
    send_commands(topics, [{"type": "run.cancel", "run_id": "cancel-me@manual:c1"}])
    wait_final(events, "slow", 1)
    wait_final(events, "cancel-me", 1)
    slow = runs_by_id(events)["slow@manual:t1"]
    assert slow[-1].state == "failed"
    assert "timed_out" in slow[-1].reason
    assert runs_by_id(events)["cancel-me@manual:c1"][-1].state == "cancelled"

    def both_gone() -> None:
        assert not _alive("sleep 27.1828"), "the cancelled run's process still runs"
        assert not _alive("sleep 31.4159"), "the timed-out run's process group still runs"

    until_passes(both_gone, 15, interval_s=0.5)


def _reports(topics: Settings, run_ids: set[str]) -> list[RunStarted | RunFinished]:
    """The start and end reports of `run_ids` on worker-reports, read to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": topics.kafka,
            "group.id": topics.group("reports-check"),
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        topic = topics.topic("worker-reports")
        consumer.assign([TopicPartition(topic, p, 0) for p in range(topics.partitions)])
        records = [JOB_LOG.decode(m.value() or b"") for m in drain(consumer, 0, to_end=True)]
    finally:
        consumer.close()
    return [r for r in records if isinstance(r, RunStarted | RunFinished) and r.run_id in run_ids]


def test_a_short_run_is_reported_once_and_a_long_one_when_it_starts(
    topics: Settings, events: EventReader
) -> None:
    """A run that ends within the worker's wait for its start report (`START_WAIT_S`) is
    reported by one record, start and end; a longer run's start is reported while it
    runs. The ledger records both starts the same way."""
    send_commands(
        topics,
        [job("brief", ["true"]), job("lasting", ["sh", "-c", "sleep 1.5"])],
    )
    events.wait_registered(["brief", "lasting"])
    send_commands(
        topics,
        [
            {"type": "job.run_now", "job_id": "brief", "request_id": "r1"},
            {"type": "job.run_now", "job_id": "lasting", "request_id": "r1"},
        ],
    )
    wait_final(events, "brief", 1)
    wait_final(events, "lasting", 1)
    brief, lasting = "brief@manual:r1", "lasting@manual:r1"
    reports = _reports(topics, {brief, lasting})
    (one,) = [r for r in reports if r.run_id == brief]
    assert isinstance(one, RunFinished)
    assert one.exit_code == 0
    assert one.started_ms is not None
    assert one.started_ms <= one.at_ms
    start, end = [r for r in reports if r.run_id == lasting]
    assert isinstance(start, RunStarted)
    assert isinstance(end, RunFinished)
    assert end.started_ms is None
    assert end.at_ms - start.at_ms >= 1_500
    runs = runs_by_id(events)
    assert [e.state for e in runs[brief]] == ["due", "dispatched", "running", "succeeded"]
    assert [e.state for e in runs[lasting]] == ["due", "dispatched", "running", "succeeded"]
    assert runs[brief][2].happened_ms == one.started_ms  # the worker's start, vouched
    assert runs[lasting][2].happened_ms == start.at_ms
    # The long run's start was on record while it ran, not with its end.
    assert runs[lasting][3].at_ms - runs[lasting][2].at_ms >= 1_000


def test_dependency_chain_and_a_failing_idempotent_job(
    topics: Settings, events: EventReader
) -> None:
    every = {"every": "3s"}
    send_commands(
        topics,
        [
            job("x", ["true"], schedule=every),
            job("y", ["true"], schedule=every, depends_on=["x"]),
            job("z", ["true"], schedule=every, depends_on=["y"]),
            job(
                "flaky",
                ["false"],
                schedule={"every": "6s"},
                idempotent=True,
                retry={
                    "max_attempts": 2,
                    "backoff_s": 1,
                    "backoff_multiplier": 2,
                    "max_backoff_s": 4,
                },
            ),
            job("after-flaky", ["true"], schedule={"every": "6s"}, depends_on=["flaky"]),
        ],
    )
    chain = ("x", "y", "z", "flaky", "after-flaky")

    def final_of(job_id: str) -> list[RunEvent]:
        return [
            evs[-1]
            for evs in runs_by_id(events).values()
            if evs[0].job_id == job_id and evs[-1].state in FINAL_STATES
        ]

    def enough() -> bool:
        """Three periods of the chain through z, and a flaky run failed with its
        downstream skipped: what the checks below need."""
        skipped = {e.scheduled_ms for e in final_of("after-flaky") if e.state == "skipped"}
        return len([e for e in final_of("z") if e.state == "succeeded"]) >= 3 and any(
            e.state == "failed" and e.scheduled_ms in skipped for e in final_of("flaky")
        )

    events.wait_until(enough, 90, "three periods of the chain and a flaky failure")
    send_commands(topics, [{"type": "job.pause", "job_id": j} for j in chain])
    events.wait_until(
        lambda: (
            {e.job_id for e in events.job_events() if e.kind == "paused"} >= set(chain)
            and all(
                evs[-1].state in FINAL_STATES
                for evs in runs_by_id(events).values()
                if evs[0].job_id in chain
            )
        ),
        60,
        "the pauses, and every run of the chain final",
    )
    runs = runs_by_id(events)

    def by_period(job_id: str) -> dict[int, list[RunEvent]]:
        return {evs[0].scheduled_ms: evs for evs in runs.values() if evs[0].job_id == job_id}

    x, y, z = by_period("x"), by_period("y"), by_period("z")
    ordered = 0
    for t, x_events in x.items():
        if t not in y or t not in z or x_events[-1].state != "succeeded":
            continue
        if z[t][-1].state != "succeeded":
            continue  # the last periods may still be in flight at pause time
        ordered += 1
        x_done = next(e.at_ms for e in x_events if e.state == "succeeded")
        y_due = next(e.at_ms for e in y[t] if e.state == "due")
        y_done = next(e.at_ms for e in y[t] if e.state == "succeeded")
        z_due = next(e.at_ms for e in z[t] if e.state == "due")
        assert [e.state for e in y[t]][:2] == ["waiting", "due"]
        assert x_done <= y_due, "y started before x succeeded"
        assert y_done <= z_due, "z started before y succeeded"
    assert ordered >= 3

    flaky = [evs for evs in by_period("flaky").values() if evs[-1].state == "failed"]
    assert flaky, "no flaky run finished"
    for evs in flaky:
        states = [(e.attempt, e.state) for e in evs]
        assert (1, "retrying") in states
        assert (2, "failed") in states
        retry_at = next(e.at_ms for e in evs if e.state == "retrying")
        second = next(e.at_ms for e in evs if e.state == "due" and e.attempt == 2)
        assert second - retry_at >= 1000  # the backoff was honoured
        downstream = by_period("after-flaky")[evs[0].scheduled_ms]
        assert downstream[-1].state == "skipped"
        assert downstream[-1].reason == "upstream flaky did not succeed"


def test_priority_and_fairness_under_contention(
    topics: Settings, events: EventReader, tmp_path: Path
) -> None:
    """One slot (cpu 2 on `big`, each run needs 2): runs queue in the dispatcher. A
    high-priority run overtakes the queue, and a small owner is not starved by a big one."""
    order = tmp_path / "order.txt"
    command = ["sh", "-c", f'echo "$CRONLOG_JOB_ID" >> {order}; sleep 1']
    need = {"cpu": 2, "memory_mb": 64}
    send_commands(
        topics,
        [
            job("hog-a", command, owner="owner-a", resources=need),
            job("small-b", command, owner="owner-b", resources=need),
            job("urgent-c", command, owner="owner-c", resources=need, priority=10),
        ],
    )
    events.wait_registered(["hog-a", "small-b", "urgent-c"])
    send_commands(
        topics,
        [{"type": "job.run_now", "job_id": "hog-a", "request_id": f"a{i}"} for i in range(6)],
    )
    # Owner-b's requests must arrive while the hog's first run or two hold the slot (the
    # property below is about what follows): a time on purpose, not a condition; waiting
    # for all six hog runs to be created let a third be placed first (seen in CI).
    time.sleep(0.5)
    send_commands(
        topics,
        [{"type": "job.run_now", "job_id": "small-b", "request_id": f"b{i}"} for i in range(2)],
    )
    send_commands(topics, [{"type": "job.run_now", "job_id": "urgent-c", "request_id": "c0"}])
    for jid, count in (("hog-a", 6), ("small-b", 2), ("urgent-c", 1)):
        wait_final(events, jid, count, timeout_s=120)
    started = order.read_text().split()
    assert sorted(started) == sorted(["hog-a"] * 6 + ["small-b"] * 2 + ["urgent-c"])
    seen = [e for e, _ in events.run_events()]

    def first_ms(run_id: str, state: str) -> int:
        return min(e.at_ms for e in seen if e.run_id == run_id and e.state == state)

    runs = {e.run_id: e.job_id for e in seen if e.job_id in ("hog-a", "small-b", "urgent-c")}
    hog_placed = [first_ms(r, "dispatched") for r, j in runs.items() if j == "hog-a"]
    # Priority, counted from when the urgent run was due (not from when the test sent it:
    # on a loaded machine the ledger may decide it seconds later, and the hog's runs take
    # the slot meanwhile, which says nothing about the queue): once it waits, it is placed
    # next, bar one hog run the dispatcher may place in the milliseconds before it reads
    # that `due`. First come, first served would place every hog run waiting first.
    (c_run,) = [r for r, j in runs.items() if j == "urgent-c"]
    c_due, c_placed = first_ms(c_run, "due"), first_ms(c_run, "dispatched")
    hogs_behind_c = [t for t in hog_placed if t > c_due]
    assert len(hogs_behind_c) >= 2, (started, "the hog had too few runs waiting to test it")
    assert sum(t < c_placed for t in hogs_behind_c) <= 1, started
    # Weighted fair queueing once owner-b's runs wait: owner-b joins level with owner-a
    # (the tie goes to owner-a, active first), so after the urgent run the two alternate
    # while both have runs waiting: at most one hog run before each of owner-b's. (How
    # many hog runs were placed before owner-b's requests arrived, one or two, depends on
    # the second the first hog run started in: not part of the property.)
    # Counted from when owner-b's first run was due (its requests and the urgent one are
    # on other partitions than the hog's, so which reaches the dispatcher first is not
    # the test's to choose): hog runs placed after it and before owner-b's first run.
    # Fair: at most one (the tie goes to owner-a), plus one the dispatcher may place in
    # the milliseconds before it reads that `due`. First come, first served would place
    # every hog run still waiting first, and at least three are (checked).
    b_due = min(first_ms(r, "due") for r, j in runs.items() if j == "small-b")
    b_placed = min(first_ms(r, "dispatched") for r, j in runs.items() if j == "small-b")
    hogs_waiting = [t for t in hog_placed if t > b_due]
    assert len(hogs_waiting) >= 3, (started, "the hog had too few runs waiting to test it")
    assert sum(t < b_placed for t in hogs_waiting) <= 2, started
    # Then the two alternate while both have runs waiting, counted the same way: from when
    # owner-b's first run was placed and its second was due, at most one hog run before
    # the second (owner-a's turn), plus one the dispatcher may place before it reads that
    # `due`. (When the first was placed before the second was due, owner-b had nothing
    # waiting in between: it joins again level with owner-a, and the tie goes to owner-a.
    # Counted from the order of the starts instead, that failed in CI: small-b, hog, hog,
    # small-b.)
    (_, b1_placed), (b2_due, b2_placed) = sorted(
        (first_ms(r, "due"), first_ms(r, "dispatched")) for r, j in runs.items() if j == "small-b"
    )
    both_waiting = max(b1_placed, b2_due)
    assert sum(both_waiting < t < b2_placed for t in hog_placed) <= 2, started
