"""Network faults: a worker on another host (a network namespace of the test's own,
tests/support/netns.py), its wall clock 20 s ahead, is cut off from the broker while it
runs long and short jobs;
in the long version (`make chaos`) also one-way loss each way, a
lossy, a slow (200 ms each way, with jitter) and a flapping link, a cut-off scheduler
node (its wall clock ten minutes behind), and a cut-off worker that is then lost for good.

The private broker serves clients on the root end of the veth pair, so the namespaced
processes reach it only across the pair, and the faults act on the pair alone. What the
user sees is checked, and what the jobs saw themselves: each job appends `start` and
`end` lines (its run, attempt and the time) to a file, so a double execution or two
attempts of one run running at once would show there whatever the reports say. Then: no
duplicate run, no firing missed, every run final, the audit clean; a cut-off worker
fenced its jobs (their processes ended) before any other worker started the same run;
runs it had claimed but not started were given back, not failed. The price of each
fault (start lateness, runs lost, jobs killed) is printed.
"""

from __future__ import annotations

import itertools
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.cluster import on_brokers, private_cluster
from tests.support.firings import (
    assert_audit_clean,
    check_firings,
    pause_and_settle,
    start_lateness,
)
from tests.support.long import LONG_TESTS
from tests.support.netns import Namespace, available, namespace
from tests.support.nodes import (
    EventReader,
    Node,
    WorkerProc,
    deaths,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)
from tests.support.skew import Skew, skew_env

pytestmark = [
    pytest.mark.skipif(available() is not None, reason=str(available())),
]

SHORT, SHORT_EVERY_S = 8, 2
LONG, LONG_EVERY_S, LONG_SLEEP_S = 4, 20, 12
CUT_S = 20  # longer than the lease (7 s) and the dead verdict (10 s)
AFTER_S = 12  # watched after each fault heals
# Clock skew combined with the faults: the far worker's wall clock ahead by more than
# a lease, the cut-off node's ten minutes behind.
FAR_SKEW, FAR_NODE_SKEW = "+20s", "-10m"


@dataclass
class World:
    settings: Settings
    logs: Path
    ns: Namespace  # the far worker's host
    node_ns: Namespace  # a second scheduler node's host (the long version)
    marks: Path
    skew: Skew | None  # a process's wall clock put off (tests/support/skew.py)
    faults: list[tuple[str, int, int]] = field(default_factory=list)  # what, from, to (ms)

    def skewed(self, offset: str) -> dict[str, str]:
        return {} if self.skew is None else self.skew(offset)


@pytest.fixture
def world(settings: Settings, tmp_path: Path) -> Iterator[World]:
    with (
        namespace("cronlog-nf", 7) as ns,
        namespace("cronlog-nf-node", 8) as node_ns,
        private_cluster(tmp_path, 1, ns.host_ip) as cluster,
    ):
        private = on_brokers(settings, cluster.bootstrap)
        ensure_topics(private)
        logs = tmp_path / "logs"
        logs.mkdir()
        marks = tmp_path / "marks"
        marks.mkdir(mode=0o777)
        try:
            skew: Skew | None = skew_env(tmp_path)
        except pytest.skip.Exception as why:
            print(f"clocks not skewed: {why}")
            skew = None
        yield World(private, logs, ns, node_ns, marks, skew)


def _command(marks: Path, sleep_s: int) -> list[str]:
    """A job that writes its own record of each execution: start, then end (also when
    killed: the group's SIGTERM ends the sleep, then the trap writes the end)."""
    mark = f'echo "$1 $CRONLOG_RUN_ID $CRONLOG_ATTEMPT $(date +%s.%N)" >> {marks}/$CRONLOG_JOB_ID'
    script = (
        f"m() {{ {mark}; }}; m start; trap 'm end; exit 143' TERM; sleep {sleep_s} & wait $!; m end"
    )
    return ["sh", "-c", script]


@dataclass(frozen=True)
class Execution:
    run_id: str
    attempt: int
    start: float
    end: float | None


def _executions(marks: Path) -> list[Execution]:
    starts: dict[tuple[str, int], list[float]] = defaultdict(list)
    ends: dict[tuple[str, int], list[float]] = defaultdict(list)
    for file in marks.iterdir():
        for line in file.read_text().splitlines():
            words = line.split()
            if len(words) != 4 or not words[3].replace(".", "").isdigit():
                continue  # a mark cut short by the group's SIGKILL
            what, run_id, attempt, at = words[0], words[1], int(words[2]), float(words[3])
            (starts if what == "start" else ends)[(run_id, attempt)].append(at)
    found = []
    for key, times in starts.items():
        assert len(times) == 1, f"attempt {key} started {len(times)} times (by the job's own count)"
        end = ends.get(key, [None])[0]
        found.append(Execution(key[0], key[1], times[0], end))
    return found


def _check_executions(marks: Path) -> int:
    """No attempt ran twice, no two attempts of one run at once; how many ran."""
    runs: dict[str, list[Execution]] = defaultdict(list)
    executions = _executions(marks)
    for e in executions:
        runs[e.run_id].append(e)
    for run_id, attempts in runs.items():
        attempts.sort(key=lambda e: e.start)
        for earlier, later in itertools.pairwise(attempts):
            overlap = f"{run_id}: attempt {earlier.attempt} still ran when {later.attempt} started"
            assert earlier.end is not None, overlap
            assert earlier.end <= later.start, overlap
    return len(executions)


def _fault(world: World, what: str, start: object, stop: object, seconds: float) -> None:
    began = int(time.time() * 1000)
    print(f"{what} for {seconds:.0f} s")
    start()  # type: ignore[operator]
    try:
        time.sleep(seconds)
    finally:
        stop()  # type: ignore[operator]
    world.faults.append((what, began, int(time.time() * 1000)))


def test_a_worker_cut_off_fences_its_jobs_before_another_runs_them(world: World) -> None:
    s, ns = world.settings, world.ns
    node = Node(s, "nf-n1", world.logs).start()
    # The far worker's wall clock is off as well: a cut-off worker cannot sample the
    # broker's time, and its lease and reports must not lean on its own clock.
    far = WorkerProc(
        s, "nf-far", world.logs, cpu=16, prefix=ns.prefix, extra_env=world.skewed(FAR_SKEW)
    ).start()
    near = WorkerProc(s, "nf-near", world.logs, cpu=16)
    events = EventReader(s, "network-faults-check")
    others: list[Node] = []
    short = [f"nf-s{i}" for i in range(SHORT)]
    long = [f"nf-l{i}" for i in range(LONG)]
    jobs = short + long
    # Idempotent, retried: a run fenced on the far worker runs again on the near one,
    # which is where two executions at once would show.
    retried: dict[str, object] = {"idempotent": True, "retry": {"max_attempts": 3, "backoff_s": 1}}
    commands: list[bytes | dict[str, object]] = [
        *(
            job(j, _command(world.marks, 0), schedule={"every": f"{SHORT_EVERY_S}s"}, **retried)
            for j in short
        ),
        *(
            job(
                j,
                _command(world.marks, LONG_SLEEP_S),
                schedule={"every": f"{LONG_EVERY_S}s"},
                timeout_s=60,
                **retried,
            )
            for j in long
        ),
    ]
    try:
        send_commands(s, commands)
        # The long jobs start on the far worker (the only one yet), then the near one joins.
        events.wait_until(
            lambda: {e.job_id for e, _ in events.run_events() if e.state == "running"} >= set(long),
            120,
            "every long job running on the far worker",
        )
        near.start()
        events.poll_for(5)

        _fault(world, "worker cut off, both ways", ns.cut, ns.heal, CUT_S)
        events.poll_for(AFTER_S)
        if LONG_TESTS:
            _fault(world, "worker's traffic out dropped", lambda: ns.drop("out"), ns.undrop, 15)
            events.poll_for(AFTER_S)
            _fault(world, "worker's traffic in dropped", lambda: ns.drop("in"), ns.undrop, 15)
            events.poll_for(AFTER_S)
            _fault(world, "10 % loss both ways", lambda: ns.drop("both", 10), ns.undrop, 30)
            events.poll_for(AFTER_S)
            port = int(s.kafka.rsplit(":", 1)[1])
            _fault(
                world,
                "200 ms latency +- 50 ms each way",
                lambda: ns.delay(port, 200, 50),
                ns.undelay,
                30,
            )
            events.poll_for(AFTER_S)
            _flap(world, ns, 30)
            events.poll_for(AFTER_S)
            # A second node on a host of its own, cut off once it holds partitions: it
            # stops deciding (its transactions are fenced) before the other takes over.
            far_node = Node(
                s,
                "nf-n2",
                world.logs,
                prefix=world.node_ns.prefix,
                extra_env=world.skewed(FAR_NODE_SKEW),
            ).start()
            others.append(far_node)
            events.poll_for(20)
            _fault(world, "a scheduler node cut off", world.node_ns.cut, world.node_ns.heal, CUT_S)
            events.poll_for(AFTER_S)
            # The far worker cut off, then lost for good while cut off.
            began = int(time.time() * 1000)
            ns.cut()
            time.sleep(3)
            far.kill()
            events.poll_for(CUT_S)
            ns.heal()
            world.faults.append(("worker cut off, then killed", began, int(time.time() * 1000)))
            events.poll_for(AFTER_S)
        dead = deaths([node, near, *others, *([] if LONG_TESTS else [far])])
        pause_and_settle(s, events, jobs)
    finally:
        events.close()
        stop_all((node, far, near, *others))

    for what, began, ended in world.faults:
        window = (began - 1000, ended + AFTER_S * 1000)
        print(f"{what}: first attempts {start_lateness(events, *window)}")
        print(f"{what}: with retries {start_lateness(events, *window, any_attempt=True)}")
    assert not dead, f"a process died on its own:\n{dead}"
    for names, every_s in ((short, SHORT_EVERY_S), (long, LONG_EVERY_S)):
        verdict = check_firings(events, names, every_s * 1000, require_success=False)
        print("verdict:", verdict.summary())
        assert verdict.lost_commands == []
        assert verdict.duplicates == []
        assert verdict.missed == [], verdict.missed[:5]
        assert verdict.not_final == []
    ran = _check_executions(world.marks)
    finals = [evs[-1] for evs in runs_by_id(events).values()]
    failed = [e for e in finals if e.state == "failed"]
    fenced = [e for e, _ in events.run_events() if "fenced" in e.reason or "lost" in e.reason]
    given_back = [e for e, _ in events.run_events() if "dispatched again" in e.reason]
    print(
        f"{ran} executions counted by the jobs, {len(finals)} runs; {len(failed)} failed; "
        f"{len(fenced)} attempts fenced or lost (retried); {len(given_back)} given back unstarted"
    )
    # Idempotent jobs with retries: a fenced attempt runs again, nothing fails for good.
    assert failed == [], [(e.run_id, e.reason) for e in failed[:5]]
    # The cut-off worker held long jobs: they were fenced (and rerun), not left running.
    assert any(e.job_id in long for e in fenced), "no long job was fenced by the cut"
    assert_audit_clean(s)


def _flap(world: World, ns: Namespace, seconds: float) -> None:
    """The link goes down and up every 3 s."""
    began = int(time.time() * 1000)
    print(f"link flapping every 3 s for {seconds:.0f} s")
    try:
        for _ in range(int(seconds // 6)):
            ns.cut()
            time.sleep(3)
            ns.heal()
            time.sleep(3)
    finally:
        ns.heal()
    world.faults.append(("link flapping every 3 s", began, int(time.time() * 1000)))
