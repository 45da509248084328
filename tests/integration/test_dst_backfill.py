"""Time zones and DST end to end: cron jobs in Europe/Berlin and America/New_York are
backfilled across the 2026 transitions through the real pipeline (commands -> ingress ->
job-log -> ledger -> run-events); the run ids carry the UTC instants the DST policy
prescribes (docs/architecture.md, "The scheduler")."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from streams.settings import Settings
from tests.support.nodes import EventReader, Node, send_commands

CASES: dict[str, tuple[str, str, str, str, str, list[str]]] = {
    # job: (cron, zone, dst policy, backfill from, to, expected scheduled instants)
    "berlin-once": (
        "30 2 * * *",
        "Europe/Berlin",
        "run_once",
        "2026-03-28T00:00:00Z",
        "2026-03-31T00:00:00Z",
        ["2026-03-28T01:30:00Z", "2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"],
    ),
    "berlin-skip": (
        "30 2 * * *",
        "Europe/Berlin",
        "skip",
        "2026-03-28T00:00:00Z",
        "2026-03-31T00:00:00Z",
        ["2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"],
    ),
    "ny-once": (
        "30 1 * * *",
        "America/New_York",
        "run_once",
        "2026-10-31T00:00:00Z",
        "2026-11-03T00:00:00Z",
        ["2026-10-31T05:30:00Z", "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
    ),
    "ny-both": (
        "30 1 * * *",
        "America/New_York",
        "both",
        "2026-10-31T00:00:00Z",
        "2026-11-03T00:00:00Z",
        [
            "2026-10-31T05:30:00Z",
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:30:00Z",
            "2026-11-02T06:30:00Z",
        ],
    ),
    "kolkata": (
        "0 9 * * 1-5",
        "Asia/Kolkata",
        "run_once",
        "2026-06-05T00:00:00Z",
        "2026-06-09T00:00:00Z",
        ["2026-06-05T03:30:00Z", "2026-06-08T03:30:00Z"],
    ),
}


@pytest.fixture(scope="module")
def node(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    started = Node(topics, "dst-n1", tmp_path_factory.mktemp("nodes")).start()
    yield started
    started.stop()


def test_backfill_across_dst_transitions(topics: Settings, node: Node) -> None:
    commands: list[bytes | dict[str, object]] = []
    for job_id, (cron, zone, dst, start, end, _) in CASES.items():
        commands.append(
            {
                "type": "job.upsert",
                "job_id": job_id,
                "owner": "t",
                "schedule": {"cron": cron, "timezone": zone},
                "dst": dst,
                "command": ["true"],
            }
        )
        commands.append({"type": "job.backfill", "job_id": job_id, "from": start, "to": end})
    send_commands(topics, commands)

    events = EventReader(topics, "dst-check")
    try:

        def created() -> dict[str, list[str]]:
            found: dict[str, list[str]] = {job: [] for job in CASES}
            for event, _ in events.run_events():
                if event.state == "due" and event.trigger == "backfill":
                    found[event.job_id].append(event.run_id.split("@", 1)[1])
            return found

        events.wait_until(
            lambda: all(len(created()[j]) >= len(c[5]) for j, c in CASES.items()),
            120,
            "backfilled runs of every job",
        )
        # Anything extra would be in view once every command sent is decided and read
        # (a backfill creates all its runs in the one decision of its command).
        events.settle()
        found = created()
    finally:
        events.close()
    for job_id, case in CASES.items():
        assert sorted(found[job_id]) == case[5], job_id
    assert node.alive
    assert Path(node.log).exists()


def test_a_backfill_sent_again_creates_nothing(topics: Settings, node: Node) -> None:
    """Run after the test above: the same backfills, again (once as a new request, once
    as the same request twice), create no second run of any time."""
    commands: list[bytes | dict[str, object]] = []
    for job_id, (_, _, _, start, end, _) in CASES.items():
        for request in ("again", "again", "once-more"):
            commands.append(
                {
                    "type": "job.backfill",
                    "job_id": job_id,
                    "from": start,
                    "to": end,
                    "request_id": request,
                }
            )
    send_commands(topics, commands)
    events = EventReader(topics, "backfill-again")
    try:
        events.settle()  # every backfill sent again decided, and what it made read
        backfilled = [
            e.run_id
            for e, _ in events.run_events()
            if e.state == "due" and e.trigger == "backfill" and e.job_id in CASES
        ]
    finally:
        events.close()
    assert len(backfilled) == sum(len(case[5]) for case in CASES.values())
    assert len(set(backfilled)) == len(backfilled)


def test_a_one_off_registered_after_its_time_leaves_a_run_event(
    topics: Settings, node: Node
) -> None:
    now = datetime.now(UTC)
    just_passed = (now - timedelta(seconds=3)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    long_passed = (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    jobs = {"once-late": (just_passed, "run_once"), "once-stale": (long_passed, "skip")}
    send_commands(
        topics,
        [
            {
                "type": "job.upsert",
                "job_id": job_id,
                "owner": "t",
                "schedule": {"at": at},
                "misfire": misfire,
                "command": ["true"],
            }
            for job_id, (at, misfire) in jobs.items()
        ],
    )
    events = EventReader(topics, "one-off-check")
    try:

        def first_states() -> dict[str, str]:
            found: dict[str, str] = {}
            for e, _ in events.run_events():
                if e.job_id in jobs:
                    found.setdefault(e.job_id, e.state)
            return found

        events.wait_until(lambda: len(first_states()) == 2, 60, "a run event of each one-off")
        states = first_states()
    finally:
        events.close()
    assert states == {"once-late": "due", "once-stale": "skipped"}
