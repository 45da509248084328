"""Clocks skewed for real (issue 12, "One clock"): the scheduler node's wall clock 10 minutes
ahead, one worker's 8 s behind and another's 8 s ahead, on the real broker and PostgreSQL,
with jobs every 1-2 s (some failing their first attempt and retried with `backoff_s: 0`)
and a worker killed with SIGKILL mid-run. No duplicate run, no two live attempts of a run,
no lost firing, no run started before its time, no healthy worker declared dead, and the
audit is clean.

How the clocks are skewed: tests/support/skew.py.
"""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from schemas.records import RunEvent
from streams.core.ids import iso_utc
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.firings import assert_audit_clean
from tests.support.nodes import (
    EventReader,
    Node,
    WorkerProc,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)
from tests.support.skew import Skew, skew_env
from tests.support.waiting import eventually

NODE_SKEW = ("+10m", 600.0)
WORKER_SKEWS = {"w-behind": ("-8s", -8.0), "w-ahead": ("+8s", 8.0)}
FIRING_S = 42  # how long the periodic jobs fire (the kill sequence takes ~25 s of it)
LEAD_MS = 10_000  # the node's pre-dispatch lead (`cronlog scheduler --lead-s`)
# How early a lone one-off may be decided: the lead and the pacer's slack
# (`Pacer.SLACK_MS`), with 6 s of margin; what the node's own clock would do (propose at
# once, 22-25 s ahead) is beyond it.
QUIET_EARLY_MS = LEAD_MS + 2_000 + 6_000
FINALS = ("succeeded", "failed", "cancelled", "skipped")


@pytest.fixture(scope="module")
def skewed(tmp_path_factory: pytest.TempPathFactory) -> Skew:
    return skew_env(tmp_path_factory.mktemp("faketime"))


@pytest.fixture(scope="module")
def cluster(
    topics: Settings, skewed: Skew, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Path, Node, dict[str, WorkerProc]]]:
    logs = tmp_path_factory.mktemp("skew")
    node = Node(topics, "skew-n1", logs, extra_env=skewed(NODE_SKEW[0])).start()
    workers = {
        w: WorkerProc(topics, w, logs, cpu=4, memory_mb=2048, extra_env=skewed(offset)).start()
        for w, (offset, _) in WORKER_SKEWS.items()
    }
    yield logs, node, workers
    stop_all([*workers.values(), node])


@pytest.fixture(scope="module")
def events(topics: Settings, cluster: object) -> Iterator[EventReader]:
    reader = EventReader(topics, "skew-check")
    yield reader
    reader.close()


def marking(marks: Path, ticks: int, fail_first: bool = False) -> list[str]:
    """A job that marks its start, a tick every 0.2 s, and its end (or SIGTERM), each with
    the machine's true clock (jobs do not inherit libfaketime)."""
    fail = '[ "$CRONLOG_ATTEMPT" = 1 ] && { t end; exit 1; }\n' if fail_first else ""
    script = (
        'm="$CRONLOG_RUN_ID $CRONLOG_ATTEMPT $CRONLOG_SCHEDULED_AT"\n'
        f't() {{ echo "$1 $(date +%s%N) $m" >> {marks}; }}\n'
        "t start\n"
        "trap 't term; exit 143' TERM\n"
        f"i=0; while [ $i -lt {ticks} ]; do sleep 0.2 & wait $!; t tick; i=$((i+1)); done\n"
        f"{fail}t end\n"
    )
    return ["sh", "-c", script]


@dataclass
class Execution:
    run_id: str
    attempt: int
    scheduled_ms: int
    start_ms: float
    last_ms: float  # the last mark: its end, its SIGTERM, or its last tick


def executions(marks: Path) -> tuple[list[Execution], Counter[tuple[str, int]]]:
    found: dict[tuple[str, int], Execution] = {}
    starts: Counter[tuple[str, int]] = Counter()
    for line in marks.read_text().splitlines():
        kind, ns, run_id, attempt, scheduled = line.split(" ")
        if not ns:
            # The SIGTERM that stops a run goes to its whole process group: a `date` it
            # catches dies with no output, and the trapped shell still writes that mark with
            # no time. Only a tick or an end can lose it: the trap is set after the start.
            assert kind != "start", line
            continue
        key, at = (run_id, int(attempt)), int(ns) / 1e6
        if kind == "start":
            starts[key] += 1
            when = datetime.fromisoformat(scheduled.replace("Z", "+00:00"))
            found[key] = Execution(run_id, int(attempt), round(when.timestamp() * 1000), at, at)
        elif key in found:
            found[key].last_ms = max(found[key].last_ms, at)
    return list(found.values()), starts


def declared_dead(log: Path) -> Counter[str]:
    """The dispatcher's verdicts in a node's log ("... declared dead, N attempts lost")."""
    dead: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        if "declared dead," in line:
            for worker in WORKER_SKEWS:
                if re.search(rf"\b{re.escape(worker)}\b", line):
                    dead[worker] += 1
    return dead


def synced_skew(log: Path) -> float:
    """The skew a process logged when its broker clock synced (+ ahead, - behind)."""
    text = log.read_text(errors="replace")
    found = re.search(r"clock is ([0-9.]+) s (ahead of|behind) the broker", text)
    assert found, f"no broker clock sync in {log.name}"
    return float(found[1]) * (1 if found[2] == "ahead of" else -1)


def states(events: EventReader, run_id: str) -> list[RunEvent]:
    return runs_by_id(events).get(run_id, [])


def test_skewed_clocks_run_every_firing_once_on_time(
    topics: Settings,
    cluster: tuple[Path, Node, dict[str, WorkerProc]],
    events: EventReader,
    skewed: Skew,
    tmp_path: Path,
) -> None:
    logs, _, workers = cluster
    marks = tmp_path / "marks.txt"
    marks.touch()
    periodic = {
        **{f"every1-{i}": (1, marking(marks, 1)) for i in range(3)},
        **{f"every2-{i}": (2, marking(marks, 2)) for i in range(2)},
        **{f"flaky-{i}": (2, marking(marks, 1, fail_first=True)) for i in range(2)},
    }
    retry = {"max_attempts": 3, "backoff_s": 0}
    # The node knows the broker's time (from the workers' heartbeats) before any job is
    # there: what it proposes is by that clock from the first proposal on.
    eventually(lambda: "broker clock synced" in (logs / "skew-n1.log").read_text(), "sync", 60)
    send_commands(
        topics,
        [
            *(
                # Idempotent: an attempt lost with the killed worker (claimed ahead, its
                # time come before the verdict) runs again, so every firing succeeds.
                job(name, command, schedule={"every": f"{every}s"}, retry=retry, idempotent=True)
                for name, (every, command) in periodic.items()
            ),
            # Killed mid-run: idempotent, so retried at once (backoff 0) on the other worker.
            job("long", marking(marks, 100), idempotent=True, retry=retry),
        ],
    )
    registered = time.time()

    def succeeded(job_id: str) -> bool:
        return any(
            e.state == "succeeded"
            for evs in runs_by_id(events).values()
            for e in evs
            if e.job_id == job_id
        )

    events.wait_until(lambda: all(succeeded(j) for j in periodic), 90, "every job's first run")

    # A worker killed with SIGKILL mid-run: its executor fences the run at its lease's
    # end, the failure detector declares the worker dead, the attempt runs again at once.
    send_commands(topics, [{"type": "job.run_now", "job_id": "long", "request_id": "k1"}])
    run = "long@manual:k1"
    events.wait_until(
        lambda: any(e.state == "running" for e in states(events, run)), 60, "the long run"
    )
    victim = next(e.worker_id for e in states(events, run) if e.state == "running")
    time.sleep(2)
    workers[victim].kill()
    killed = time.time()
    events.wait_until(
        lambda: any(e.state == "running" and e.attempt == 2 for e in states(events, run)),
        60,
        "the long run's second attempt",
    )
    workers[victim].start()  # the same id, journal and skew

    time.sleep(max(0.0, registered + FIRING_S - time.time()))
    send_commands(topics, [{"type": "job.pause", "job_id": name} for name in periodic])
    paused = time.time()

    def settled() -> bool:
        runs = runs_by_id(events)
        return bool(runs) and all(evs[-1].state in FINALS for evs in runs.values())

    events.wait_until(settled, 120, "every run final")
    events.settle()  # the pauses decided, and every proposal written by then

    # -- the clocks were skewed, and each process found the broker's ----------------------
    assert synced_skew(logs / "skew-n1.log") == pytest.approx(NODE_SKEW[1], abs=2)
    for worker, (_, skew) in WORKER_SKEWS.items():
        assert synced_skew(logs / f"{worker}.log") == pytest.approx(skew, abs=1)

    # -- no duplicate run, no lost firing ----------------------------------------------------
    by_time: defaultdict[tuple[str, int], set[str]] = defaultdict(set)
    runs = runs_by_id(events)
    for run_id, evs in runs.items():
        if evs[0].trigger != "manual":
            by_time[(evs[0].job_id, evs[0].scheduled_ms)].add(run_id)
    assert not [k for k, ids in by_time.items() if len(ids) > 1], "two runs of one firing"
    # Proposed on time by the node 10 minutes ahead: a run is created at most the lead
    # before its time (by its wall clock, every firing would be proposed as soon as the
    # previous one was decided, and accepted up to the ledger's 60 s maximum lead).
    ahead = max(evs[0].scheduled_ms - evs[0].at_ms for evs in runs.values())
    assert ahead <= LEAD_MS + 500, f"runs created {ahead} ms ahead of their time"
    for name, (every, _) in periodic.items():
        times = sorted(t for j, t in by_time if j == name)
        window = [t for t in times if t <= paused * 1000 - 3000]
        gaps = [b - a for a, b in itertools.pairwise(window) if b - a != every * 1000]
        assert not gaps, f"{name}: firings missing (gaps {gaps})"
        assert len(window) >= (paused - registered - 20) / every, f"{name}: too few firings"
        for t in window:
            (run_id,) = by_time[(name, t)]
            assert runs[run_id][-1].state == "succeeded", [
                (e.attempt, e.state, e.worker_id, e.reason) for e in runs[run_id]
            ]

    # -- every execution once, none before its time, none beside another attempt ----------
    done, starts = executions(marks)
    assert not [k for k, n in starts.items() if n > 1], "an attempt started twice"
    early = [e for e in done if e.attempt == 1 and e.start_ms < e.scheduled_ms - 5]
    assert not early, f"started before their time: {early[:5]}"
    calm = [
        e.start_ms - e.scheduled_ms
        for e in done
        if e.attempt == 1
        and "@manual" not in e.run_id
        and not killed - 15 < e.scheduled_ms / 1000 < killed + 25
    ]
    assert calm
    assert max(calm) < 2500, f"late starts away from the kill: {sorted(calm)[-5:]}"
    attempts: defaultdict[str, list[Execution]] = defaultdict(list)
    for e in done:
        attempts[e.run_id].append(e)
    for run_id, runs_of in attempts.items():
        runs_of.sort(key=lambda e: e.attempt)
        for before, after in itertools.pairwise(runs_of):
            assert before.last_ms < after.start_ms, f"{run_id}: attempts {before} and {after}"
    assert [e.attempt for e in sorted(attempts[run], key=lambda e: e.attempt)] == [1, 2]
    assert any(e.attempt == 2 for e in done if e.run_id.startswith("flaky-"))

    # -- only the killed worker was declared dead, once -----------------------------------
    assert declared_dead(logs / "skew-n1.log") == Counter({victim: 1})

    # -- the audit ----------------------------------------------------------------------------
    # "Now" well after the pause: every firing up to it is checked (none is in flight).
    assert_audit_clean(topics)


def test_a_node_with_no_worker_learns_the_broker_time_before_it_proposes(
    topics: Settings, skewed: Skew, tmp_path: Path
) -> None:
    """A node 10 minutes ahead with no worker (no heartbeats) learns the broker's time from
    its own clock probe as it starts, before it proposes anything by its wrong clock (were
    it to propose by it first, it would rebuild its timers once synced: `_resync`): a
    one-off 25 s away is proposed on time, not 10 minutes early nor late. By its own
    clock it would be proposed at once, 25 s ahead, where a quiet firing is proposed its
    lead and the pacer's slack ahead (12 s)."""
    alone = topics.with_(topic_prefix=f"{topics.topic_prefix}alone.")
    ensure_topics(alone)
    node = Node(alone, "alone-n1", tmp_path, extra_env=skewed(NODE_SKEW[0])).start()
    reader = EventReader(alone, "alone-check")
    try:
        send_commands(alone, [job("warmup", ["true"])])
        reader.wait_until(lambda: bool(reader.job_events()), 90, "the node to be up")
        at_ms = (int(time.time()) + 25) * 1000
        send_commands(alone, [job("once", ["true"], schedule={"at": iso_utc(at_ms)})])
        reader.wait_until(
            lambda: any(e.job_id == "once" for e, _ in reader.run_events()),
            at_ms / 1000 - time.time() + 15,
            "the one-off's run",
        )
        created = next(e for e, _ in reader.run_events() if e.job_id == "once")
        assert created.scheduled_ms == at_ms
        # Decided by its lead on the broker's time (by the node's, 10 minutes late).
        assert 0 <= at_ms - created.at_ms <= QUIET_EARLY_MS
        assert synced_skew(tmp_path / "alone-n1.log") == pytest.approx(NODE_SKEW[1], abs=2)
    finally:
        reader.close()
        node.stop()
