"""Owner-controlled inputs whose outputs pass the limits (issue 53, items 1 and 6).

An ordinary owner writes only what the limits allow, yet may ask for more than they
allow once parameters are substituted: a 20 KB command of `{v}` and one 1 KiB default
is a 7 MB dispatch request; 32 parameters each used many times; a run-now or a backfill
whose values do the same. Before the fix such an input stopped its ledger partition for
every owner (the producer refused the output, the ledger aborted and re-read it for
ever). What must hold, on the commands topic and through the API, against a real node
on the real broker: another owner's run-now on every partition, sent after the hostile
inputs, is dispatched; every hostile input is refused (dead-lettered, or a 422) naming
the limit as written, and no run of it is made; no process dies.

The API's refusals (422 naming the limit as written for a registration whose defaults,
or a run-now or backfill whose values, pass it) are checked here too, with another
owner's small run-now accepted and dispatched after them.

`CRONLOG_FUZZ_N` scales the hostile inputs (200 in `make test`: one of each kind a
partition; 10,000 in `make fuzz`: 50 of each kind a partition).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from schemas.json import read_dlq_record
from streams.kafka import partition_for
from streams.settings import Settings
from tests.support.kafka import consumer
from tests.support.nodes import (
    CronlogProcess,
    EventReader,
    Node,
    ProjectorProc,
    WorkerProc,
    job,
    runs_by_id,
    send_commands,
    stop_all,
)
from tests.support.ports import free_port
from tests.support.waiting import eventually

N = int(os.environ.get("CRONLOG_FUZZ_N", "200"))
PER_KIND = max(1, N // 200)
SEED = 53
VALUE = "x" * 1024  # the longest string value a run may be given
HOSTILE = "fzl-noisy"
CALM = "fzl-calm"


def _ids(prefix: str, partitions: int, count: int) -> list[str]:
    """`count` job ids on each partition, so that every partition holds them."""
    found: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(ids) < count for ids in found.values()):
        jid = f"{prefix}-{i}"
        bucket = found[partition_for(jid, partitions)]
        if len(bucket) < count:
            bucket.append(jid)
        i += 1
    return [jid for ids in found.values() for jid in ids]


def _placeholders(rng: random.Random, names: list[str], chars: int) -> str:
    """About `chars` characters of `{name}` placeholders (the spec stays under 64 KiB)."""
    parts: list[str] = []
    size = 0
    while size < chars:
        part = "{" + rng.choice(names) + "}"
        parts.append(part)
        size += len(part)
    return "".join(parts)


def _hostile(rng: random.Random, jid: str, kind: int) -> list[dict[str, object]]:
    """One hostile owner's commands for job `jid`: each kind's outputs pass the limits
    only after substitution."""
    if kind == 0:  # a default under a schedule: every firing is the huge one
        spec = job(
            jid,
            ["sh", "-c", _placeholders(rng, ["v"], 20_000)],
            owner=HOSTILE,
            schedule={"every": "5s"},
            params={"v": {"type": "string", "default": VALUE}},
            params_in_command=True,
        )
        return [spec]
    if kind == 1:  # a run-now's value
        spec = job(
            jid,
            ["echo", _placeholders(rng, ["v"], 20_000)],
            owner=HOSTILE,
            params={"v": {"type": "string"}},
            params_in_command=True,
        )
        run: dict[str, object] = {
            "type": "job.run_now",
            "job_id": jid,
            "request_id": "big",
            "params": {"v": VALUE},
        }
        return [spec, run]
    if kind == 2:  # many parameters, each used many times, within the values' 8 KiB
        names = [f"p{i}" for i in range(32)]
        spec = job(
            jid,
            ["echo", *(_placeholders(rng, names, 1_500) for _ in range(12))],
            owner=HOSTILE,
            schedule={"every": "5s"},
            params={n: {"type": "string", "default": "y" * 200} for n in names},
            params_in_command=True,
        )
        return [spec]
    # a backfill's value, many runs at once
    spec = job(
        jid,
        ["echo", _placeholders(rng, ["v"], 20_000)],
        owner=HOSTILE,
        schedule={"cron": "0 * * * *"},
        params={"v": {"type": "string", "default": "small"}},
        params_in_command=True,
    )
    backfill: dict[str, object] = {
        "type": "job.backfill",
        "job_id": jid,
        "from": "2026-01-01T00:00:00Z",
        "to": "2026-01-02T00:00:00Z",
        "request_id": "bf",
        "params": {"v": VALUE},
    }
    return [spec, backfill]


def _dispatched(events: EventReader, run_ids: set[str]) -> bool:
    seen = runs_by_id(events)
    return all(any(e.state == "dispatched" for e in seen.get(r, [])) for r in run_ids)


@pytest.fixture(scope="module")
def node(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    """A node and a worker that would run whatever it is given: a hostile run is not
    dispatched because the ledger refused it, not for want of a worker."""
    logs: Path = tmp_path_factory.mktemp("fuzz-limits")
    started = Node(topics, "fzl-n1", logs).start()
    worker = WorkerProc(topics, "fzl-w1", logs, cpu=4, memory_mb=4096).start()
    projector = ProjectorProc(topics, logs / "fzl-projector.log").start()  # for the API
    yield started
    stop_all([projector, worker, started])


def test_outputs_past_the_limits_stop_no_partition_on_the_topic_path(
    topics: Settings, node: Node
) -> None:
    rng = random.Random(SEED)
    events = EventReader(topics, "fzl-topic")
    try:
        hostile = _ids("fzl-h", topics.partitions, 4 * PER_KIND)
        commands: list[bytes | dict[str, object]] = []
        for i, jid in enumerate(hostile):
            commands += _hostile(rng, jid, i % 4)
        send_commands(topics, commands)
        calm = _ids("fzl-c", topics.partitions, 1)
        send_commands(topics, [job(jid, ["true"], owner=CALM) for jid in calm])
        send_commands(
            topics,
            [{"type": "job.run_now", "job_id": jid, "request_id": "r1"} for jid in calm],
        )
        wanted = {f"{jid}@manual:r1" for jid in calm}
        events.wait_until(
            lambda: _dispatched(events, wanted),
            120,
            "the calm owner's run-now dispatched on every partition",
        )
        # Every hostile input refused, naming the limit as written: the registrations
        # whose defaults pass it by ingress, the run-nows and backfills by the ledger.
        dlq = consumer(topics, "commands.dlq")
        reasons: dict[str, str] = {}

        def dead_lettered() -> bool:
            for message in dlq.consume(1000, timeout=0.5):
                key = (message.key() or b"").decode(errors="replace")
                letter = read_dlq_record(message.value() or b"{}")
                if key in hostile and "would be" in letter.reason:
                    reasons[key] = letter.reason
            return set(hostile) <= set(reasons)

        try:
            eventually(dead_lettered, "every hostile input dead-lettered with its reason", 120)
        finally:
            dlq.close()
        assert all("at most" in reason for reason in reasons.values()), reasons
        made = {e.run_id for evs in runs_by_id(events).values() for e in evs if e.job_id in hostile}
        assert not made, f"runs past the limit were made: {sorted(made)[:3]}"
        assert node.alive, "the scheduler node died"
        recoveries = node.log.read_text(errors="replace").count("aborting and recovering")
        print(
            f"fuzz limits: {len(hostile)} hostile jobs ({PER_KIND} of each kind a partition), "
            f"{len(calm)} calm run-nows dispatched, {recoveries} ledger recoveries"
        )
    finally:
        events.close()


OWNER_TOKEN = "tok-fzl-noisy-0123456789"
CALM_TOKEN = "tok-fzl-calm-0123456789a"


def test_outputs_past_the_limits_stop_no_partition_through_the_api(
    topics: Settings, node: Node, tmp_path: Path
) -> None:
    rng = random.Random(SEED + 1)
    port = free_port()
    env = {
        "CRONLOG_API_TOKENS": f"{OWNER_TOKEN}={HOSTILE},{CALM_TOKEN}={CALM}",
        "CRONLOG_API_ADMIN_TOKENS": "tok-fzl-admin-0123456789",
        "CRONLOG_API_RATE": "0",
    }
    api_proc = CronlogProcess(
        topics, "fzl-api", tmp_path, ["api", "--port", str(port), "--loglevel", "warning"], env
    ).start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    events = EventReader(topics, "fzl-api")
    hostile_auth = {"Authorization": f"Bearer {OWNER_TOKEN}"}
    calm_auth = {"Authorization": f"Bearer {CALM_TOKEN}"}

    def ready() -> bool:
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(ready, "the API to be ready")
        answers: list[int] = []
        refused: list[str] = []
        hostile = _ids("fzl-ah", topics.partitions, 4 * PER_KIND)
        for i, jid in enumerate(hostile):
            spec, *requests = _hostile(rng, jid, i % 4)
            body = {k: v for k, v in spec.items() if k not in ("type", "owner")}
            made = client.post("/jobs", json=body, headers=hostile_auth)
            answers.append(made.status_code)
            if made.status_code >= 400:
                refused.append(made.text)
                continue
            for request in requests:
                action = "run-now" if request["type"] == "job.run_now" else "backfill"
                payload = {k: v for k, v in request.items() if k not in ("type", "job_id")}

                def answered(
                    path: str = f"/jobs/{jid}/{action}", body: dict[str, object] = payload
                ) -> httpx.Response | None:
                    got = client.post(path, json=body, headers=hostile_auth)
                    return None if got.status_code == 404 else got  # not projected yet

                asked = eventually(answered, f"{jid} projected")
                answers.append(asked.status_code)
                if asked.status_code >= 400:
                    refused.append(asked.text)
        assert all(code < 500 for code in answers), answers
        # Every hostile request's size is refused up front, naming it.
        assert len(refused) == len(hostile), refused[:3]
        assert all("would be" in text for text in refused), [
            t for t in refused if "would be" not in t
        ]
        calm = _ids("fzl-ac", topics.partitions, 1)
        for jid in calm:
            made = client.post(
                "/jobs",
                json={
                    "job_id": jid,
                    "command": ["true"],
                    "schedule": {"at": "2099-01-01T00:00:00Z"},
                },
                headers=calm_auth,
            )
            assert made.status_code in (201, 202), made.text
        events.wait_registered(calm)
        wanted = set()
        for jid in calm:

            def run_now(path: str = f"/jobs/{jid}/run-now") -> httpx.Response | None:
                got = client.post(path, json={"request_id": "r1"}, headers=calm_auth)
                return None if got.status_code == 404 else got  # not projected yet

            asked = eventually(run_now, f"{jid} projected")
            assert asked.status_code in (200, 201, 202), asked.text
            wanted.add(f"{jid}@manual:r1")
        events.wait_until(
            lambda: _dispatched(events, wanted),
            120,
            "the calm owner's run-now dispatched on every partition",
        )
        assert node.alive, "the scheduler node died"
        assert api_proc.alive, "the API died"
    finally:
        events.close()
        client.close()
        stop_all([api_proc])
