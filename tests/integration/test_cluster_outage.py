"""An outage of the whole cluster rewrites no history (long: `make chaos`).

Every broker of the cluster is killed at once (one private broker; three, of a private
replicated cluster) under 20 jobs every 2 s whose command records its own execution,
each with `timeout_s` 3, so the ledger's timeout backstop (start + 3 s + the 30 s grace)
of every run in flight passes while the cluster is down (45 s). The brokers come back
on their data. Then, for every scheduled run: none is recorded failed though it ran
(the job's own record), none failed "no report from the worker" though it never
started (it could still run), and every run is final, with the audit clean.

Before the backstop asked first (streams/core/ledger/attempts.py `deadline`), the
scheduler's notices, queued through the outage with a time that ran on, reached the
ledger before the workers' held reports and failed 26-56 runs of such an outage that
had run and exited 0.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest

from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.broker import private_broker
from tests.support.cluster import on_brokers, private_cluster
from tests.support.firings import assert_audit_clean, pause_and_settle
from tests.support.long import LONG_TESTS
from tests.support.nodes import (
    EventReader,
    Node,
    WorkerProc,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)

pytestmark = pytest.mark.skipif(not LONG_TESTS, reason="long: make chaos (CRONLOG_LONG_TESTS=1)")

JOBS = 20
EVERY_S = 2
DOWN_S = 45.0


@dataclass(frozen=True)
class Brokers:
    """Every broker of a private cluster, killed and started together."""

    kill: list[Callable[[], None]]
    start: list[Callable[[], None]]
    bootstrap: str

    def kill_all(self) -> None:
        for kill in self.kill:
            kill()

    def start_all(self) -> None:
        for start in self.start:
            start()


@contextmanager
def brokers(kind: str, tmp: Path) -> Iterator[Brokers]:
    if kind == "one broker":
        with private_broker(tmp) as broker:
            yield Brokers([broker.kill], [broker.start], broker.bootstrap)
        return
    with private_cluster(tmp) as cluster:
        ids = cluster.node_ids
        yield Brokers(
            [partial(cluster.kill, n) for n in ids],
            [partial(cluster.start, n) for n in ids],
            cluster.bootstrap,
        )


def executions(marks: Path) -> dict[str, set[str]]:
    """run id -> the marks its job wrote ("start", "end")."""
    found: dict[str, set[str]] = {}
    for f in marks.iterdir():
        for line in f.read_text().splitlines():
            mark, _, run_id = line.partition(" ")
            found.setdefault(run_id, set()).add(mark)
    return found


@pytest.mark.parametrize("kind", ["one broker", "three brokers"])
def test_an_outage_of_every_broker_fails_no_run_that_ran_or_could_still_run(
    settings: Settings, tmp_path: Path, kind: str
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    with brokers(kind, tmp_path) as cluster:
        private = on_brokers(settings, cluster.bootstrap)
        ensure_topics(private)
        procs = [
            Node(private, "n1", logs).start(),
            WorkerProc(private, "w1", logs, cpu=8, memory_mb=4096).start(),
            WorkerProc(private, "w2", logs, cpu=8, memory_mb=4096).start(),
        ]
        events = EventReader(private, "outage-check")
        names = [f"co-{i:02d}" for i in range(JOBS)]
        # The marks live under the test's folder, outside the sandbox's private /tmp
        # only when the worker confines its jobs: a root worker here runs them unconfined.
        command = [
            "sh",
            "-c",
            f'd={marks}/$CRONLOG_JOB_ID; echo "start $CRONLOG_RUN_ID" >> "$d"; '
            f'sleep 1; echo "end $CRONLOG_RUN_ID" >> "$d"',
        ]
        try:
            send_commands(
                private,
                [job(n, command, schedule={"every": f"{EVERY_S}s"}, timeout_s=3) for n in names],
            )
            events.wait_until(
                lambda: sum(e.state == "succeeded" for e, _ in events.run_events()) >= JOBS,
                180,
                "the first runs",
            )
            events.poll_for(20)
            cluster.kill_all()
            killed = time.time()
            time.sleep(DOWN_S)
            cluster.start_all()
            back = time.time()
            assert all(p.alive for p in procs), "a process exited during the outage"
            events.poll_for(90)
            pause_and_settle(private, events, names)
            runs = runs_by_id(events)
        finally:
            events.close()
            stop_all(procs)
        ran = executions(marks)
        wrong: list[str] = []
        outcomes: Counter[str] = Counter()
        for run_id, evs in runs.items():
            last = evs[-1]
            if last.state == "failed" and ("start" in ran.get(run_id, set())):
                wrong.append(f"{run_id} failed though it ran: {last.reason}")
            elif last.state == "failed" and "no report" in last.reason:
                wrong.append(f"{run_id} failed for silence though it never started")
            if killed * 1000 <= evs[0].scheduled_ms <= back * 1000:
                outcomes[f"{last.state} {last.reason[:40]}".strip()] += 1
        print(f"{kind}: outage {back - killed:.0f} s; runs due in it: {dict(outcomes)}")
        assert not wrong, wrong[:20]
        assert outcomes, "no run came due during the outage"
        assert_audit_clean(private)
