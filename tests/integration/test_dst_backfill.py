"""Time zones and DST end to end: cron jobs in Europe/Berlin and America/New_York are
backfilled across the 2026 transitions through the real pipeline (commands -> ingress ->
job-log -> ledger -> run-events); the run ids carry the UTC instants the DST policy
prescribes (design.md section 5)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams.settings import Settings
from tests.support.nodes import EventReader, Node, send_commands

pytestmark = pytest.mark.integration

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
        events.poll_for(2)  # anything extra would show up now
        found = created()
    finally:
        events.close()
    for job_id, case in CASES.items():
        assert sorted(found[job_id]) == case[5], job_id
    assert node.alive
    assert Path(node.log).exists()
