"""The REST API end to end on the real stack: a scheduler node, a worker, the projector
and `cronlog api` as real processes; requests over HTTP with httpx."""

from __future__ import annotations

import base64
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from streams.core.commands import MAX_COMMAND_BYTES
from streams.core.job_schema import job_file_schema, job_schema
from streams.settings import Settings
from tests.support.nodes import (
    CronlogProcess,
    Node,
    ProjectorProc,
    WorkerProc,
    cli_with_only,
    env_for,
    send_commands,
    stop_all,
)
from tests.support.ports import free_port
from tests.support.secure import role_env
from tests.support.waiting import eventually

TOKENS = {
    "CRONLOG_API_TOKENS": "tok-a-0123456789ab=team-a,tok-b-0123456789ab=team-b",
    "CRONLOG_API_ADMIN_TOKENS": "tok-admin-0123456789ab",
    "CRONLOG_WORKER_TOKENS": "tok-w-0123456789ab=w1",
}
A = {"Authorization": "Bearer tok-a-0123456789ab"}
B = {"Authorization": "Bearer tok-b-0123456789ab"}
ADMIN = {"Authorization": "Bearer tok-admin-0123456789ab"}


@pytest.fixture(scope="module")
def api(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    logs: Path = tmp_path_factory.mktemp("api")
    port = free_port()
    # A tokens file beside the environment's: `cronlog tokens` adds to it while the API
    # runs (test_a_team_added_with_one_command_calls_the_api_without_a_restart).
    tokens_file = logs / "api-tokens.yaml"
    tokens_file.write_text("owners: {}\n")
    procs: list[CronlogProcess] = [
        Node(topics, "api-n1", logs),
        WorkerProc(topics, "api-w1", logs, cpu=2, memory_mb=512),
        ProjectorProc(topics, logs / "projector.log"),
        CronlogProcess(
            topics,
            "api",
            logs,
            ["api", "--port", str(port), "--loglevel", "warning"],
            extra_env={**TOKENS, "CRONLOG_API_TOKENS_FILE": str(tokens_file)},
        ),
    ]
    for proc in procs:
        proc.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    client.tokens_file = tokens_file  # type: ignore[attr-defined]

    def healthy() -> bool:
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(healthy, "the API to be ready")
        yield client
    finally:
        client.close()
        stop_all(reversed(procs))


def job_body(job_id: str, **extra: Any) -> dict[str, Any]:
    return {"job_id": job_id, "schedule": {"every": "2s"}, "command": ["echo", "hi"], **extra}


def created(api: httpx.Client, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    answer = api.post("/jobs", json=body, headers=headers)
    assert answer.status_code in (201, 202), answer.text
    job_id = body["job_id"]
    return eventually(  # type: ignore[no-any-return]
        lambda: (r := api.get(f"/jobs/{job_id}", headers=headers)).status_code == 200 and r.json(),
        f"job {job_id} in the projection",
    )


def test_job_lifecycle(api: httpx.Client) -> None:
    job = created(api, job_body("life"), A)
    assert job["owner"] == "team-a"
    assert job["spec"]["schedule"] == {"every_ms": 2000}
    assert api.post("/jobs", json=job_body("life"), headers=A).status_code == 409

    patched = api.patch("/jobs/life", json={"schedule": {"every": "3s"}}, headers=A)
    assert patched.status_code in (200, 202), patched.text
    eventually(
        lambda: api.get("/jobs/life", headers=A).json()["spec"]["schedule"] == {"every_ms": 3000},
        "the patched schedule",
    )
    run = eventually(
        lambda: api.get("/jobs/life/runs", params={"state": "succeeded"}, headers=A).json()[
            "items"
        ],
        "a succeeded run",
    )[0]
    detail = eventually(
        lambda: (d := api.get(f"/runs/{run['run_id']}", headers=A).json())["log_tail"] and d,
        "the run's log",
    )
    assert [t["state"] for t in detail["transitions"]][-2:] == ["running", "succeeded"]
    assert detail["log_tail"] == "hi\n"
    assert api.get(f"/runs/{run['run_id']}/logs", headers=A).text == "hi\n"

    paused = api.post("/jobs/life/pause", headers=A)
    assert paused.status_code in (200, 202)
    eventually(lambda: api.get("/jobs/life", headers=A).json()["paused"], "paused")
    resumed = api.post("/jobs/life/resume", headers=A)
    assert resumed.status_code in (200, 202)
    eventually(lambda: not api.get("/jobs/life", headers=A).json()["paused"], "resumed")

    assert api.delete("/jobs/life", headers=A).status_code in (200, 202)
    eventually(lambda: api.get("/jobs/life", headers=A).status_code == 404, "deleted")


@pytest.mark.parametrize(
    ("job_id", "schedule", "stored"),
    [
        ("patch-every", {"every": "90m"}, {"every_ms": 5_400_000}),
        ("patch-at", {"at": "2099-01-01T01:00:00.250+01:00"}, {"at_ms": 4_070_908_800_250}),
        (
            "patch-cron",
            {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
            {"cron": "0 3 * * *", "timezone": "Europe/Berlin"},
        ),
    ],
)
def test_patch_changes_a_field_of_any_schedule_kind(
    api: httpx.Client, job_id: str, schedule: dict[str, str], stored: dict[str, Any]
) -> None:
    """Issue 12: PATCH {"priority": 3} on an `every` or `at` job answered 422, the stored
    spec's schedule ({"every_ms": ...}) being sent back as a command. Now only the
    priority changes; the schedule and every other field stay as they were."""
    extra = {"env": {"MODE": "x"}, "retry": {"max_attempts": 2}, "dst": "both"}
    job = created(api, job_body(job_id, schedule=schedule, **extra), A)
    assert job["spec"]["schedule"] == stored
    patched = api.patch(f"/jobs/{job_id}", json={"priority": 3}, headers=A)
    assert patched.status_code in (200, 202), patched.text
    after = eventually(
        lambda: (j := api.get(f"/jobs/{job_id}", headers=A).json())["spec"]["priority"] == 3 and j,
        "the patched priority",
    )
    assert after["spec"] == {**job["spec"], "priority": 3}
    assert api.delete(f"/jobs/{job_id}", headers=A).status_code in (200, 202)


def test_run_now_is_idempotent_and_cancel_stops_a_run(api: httpx.Client) -> None:
    """On a manual job (`schedule: manual`: no schedule, no upstreams; issue 55), which
    runs only when asked: the one run is the run-now's."""
    job = created(api, job_body("sleeper", schedule="manual", command=["sleep", "60"]), A)
    assert job["spec"]["schedule"] is None
    assert job["next_due_at"] is None
    first = api.post("/jobs/sleeper/run-now", headers={**A, "Idempotency-Key": "once"})
    again = api.post("/jobs/sleeper/run-now", json={"request_id": "once"}, headers=A)
    assert first.status_code == again.status_code == 202
    run_id = first.json()["run_id"]
    assert run_id == again.json()["run_id"] == "sleeper@manual:once"
    eventually(
        lambda: api.get(f"/runs/{run_id}", headers=A).json().get("state") == "running",
        "the manual run to start",
    )
    assert api.post(f"/runs/{run_id}/cancel", headers=A).status_code == 202
    final = eventually(
        lambda: (r := api.get(f"/runs/{run_id}", headers=A).json())["state"] == "cancelled" and r,
        "the cancel",
    )
    assert [t["state"] for t in final["transitions"]].count("running") == 1
    runs = api.get("/runs", params={"job_id": "sleeper"}, headers=A).json()["items"]
    assert [r["run_id"] for r in runs] == [run_id]


def test_owners_are_scoped_and_tokens_checked(api: httpx.Client) -> None:
    created(api, job_body("mine-a"), A)
    created(api, job_body("mine-b"), B)
    assert api.get("/jobs").status_code == 401
    assert api.get("/jobs", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert api.get("/jobs", headers={"Authorization": "Basic x"}).status_code == 401
    assert (
        api.get("/jobs", headers={"Authorization": "Bearer tok-w-0123456789ab"}).status_code == 403
    )
    assert api.get("/jobs/mine-b", headers=A).status_code == 404
    assert api.post("/jobs/mine-b/pause", headers=A).status_code == 404
    assert api.patch("/jobs/mine-b", json={"priority": 1}, headers=A).status_code == 404
    seen_a = {j["job_id"] for j in api.get("/jobs", headers=A).json()["items"]}
    assert "mine-a" in seen_a
    assert "mine-b" not in seen_a
    seen_admin = {j["job_id"] for j in api.get("/jobs", headers=ADMIN).json()["items"]}
    assert {"mine-a", "mine-b"} <= seen_admin
    other = api.post("/jobs", json=job_body("theirs", owner="team-b"), headers=A)
    assert other.status_code == 403
    assert other.json()["error"]["field"] == "owner"
    b_runs = api.get("/runs", params={"job_id": "mine-b"}, headers=A)
    assert b_runs.status_code == 404
    # depends_on only on the owner's own jobs (the ledger refuses the link anyway).
    spy = api.post("/jobs", json={**job_body("spy-a"), "depends_on": ["mine-b"]}, headers=A)
    assert spy.status_code == 422
    assert spy.json()["error"]["field"] == "depends_on"
    assert "another owner" in spy.json()["error"]["message"]
    own = {"job_id": "after-a", "command": ["true"], "depends_on": ["mine-a", "not-yet"]}
    answer = api.post("/jobs", json=own, headers=A, params={"allow_missing_upstreams": "true"})
    assert answer.status_code in (201, 202), answer.text


@pytest.mark.parametrize(
    ("body", "status", "field", "words"),
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"[1, 2]", 400, None, "JSON object"),
        (
            b'{"job_id": "x", "schedule": {"cron": "61 * * * *"}, "command": ["true"]}',
            422,
            "schedule",
            "invalid cron",
        ),
        (
            b'{"job_id": "x", "schedule": {"cron": "* * * * *", "timezone": "Mars/Base"},'
            b' "command": ["true"]}',
            422,
            "schedule",
            "time zone",
        ),
        (
            b'{"job_id": "x", "schedule": {"every": "1s"}, "command": ["true"],'
            b' "resources": {"cpu": -1}}',
            422,
            "resources.cpu",
            "cpu",
        ),
        (b'{"job_id": "x", "schedule": {"every": "1s"}, "command": []}', 422, "command", ""),
        (
            b'{"job_id": "x", "schedule": {"every": "1s"}, "command": ["true"], "colour": 1}',
            422,
            "colour",
            "unknown field",
        ),
        (
            b'{"job_id": "x", "schedule": {"every": "1s"}, "command": ["true"],'
            b' "notify": {"url": "https://h/x", "on": ["exploded"]}}',
            422,
            "notify.on",
            "notify.on must list some of failed, lost, skipped, late",
        ),
        (
            b'{"job_id": "x", "schedule": {"every": "1s"}, "command": ["true"], "sla_s": 0}',
            422,
            "sla_s",
            "sla_s must be > 0",
        ),
        (
            b'{"job_id": "x", "command": ["true"], "pad": "' + b"x" * MAX_COMMAND_BYTES + b'"}',
            413,
            None,
            "at most",
        ),
    ],
)
def test_bad_job_bodies(
    api: httpx.Client, body: bytes, status: int, field: str | None, words: str
) -> None:
    answer = api.post("/jobs", content=body, headers={**A, "Content-Type": "application/json"})
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert error["status"] == status
    assert words in error["message"]
    if field is not None:
        assert error["field"] == field


def test_other_error_paths(api: httpx.Client) -> None:
    missing = api.get("/jobs/no-such-job", headers=A)
    assert missing.status_code == 404
    assert "not found" in missing.json()["error"]["message"]
    assert api.get("/runs/no-such@2026-01-01T00:00:00Z", headers=A).status_code == 404
    assert api.post("/runs/no-such@2026-01-01T00:00:00Z/cancel", headers=A).status_code == 404
    assert api.get("/jobs", params={"limit": 0}, headers=A).status_code == 422
    assert api.get("/jobs", params={"cursor": "%%%"}, headers=A).status_code == 400
    assert api.get("/runs", params={"from": "yesterday"}, headers=A).status_code == 422
    created(api, job_body("errs"), A)
    bad_patch = api.patch("/jobs/errs", json={"job_id": "other"}, headers=A)
    assert bad_patch.status_code == 422
    bad_backfill = api.post("/jobs/errs/backfill", json={"from": "x", "to": "y"}, headers=A)
    assert bad_backfill.status_code == 422
    # A run the projection does not hold yet (run-now answered its id a moment ago) is
    # commanded through its job's owner; another owner's, or a malformed id, is not found.
    assert api.post("/runs/errs@manual:not-yet/cancel", headers=A).status_code == 202
    assert api.post("/runs/errs@manual:not-yet/cancel", headers=B).status_code == 404
    assert api.post("/runs/errs@yesterday/cancel", headers=A).status_code == 404
    assert api.get("/nowhere", headers=A).status_code == 404


def test_listing_filters_and_pages(api: httpx.Client) -> None:
    for n in range(3):
        created(api, job_body(f"page-{n}", schedule={"at": "2099-01-01T00:00:00Z"}), B)
    first = api.get("/jobs", params={"limit": 2}, headers=B).json()
    assert len(first["items"]) == 2
    assert first["next"]
    rest = api.get("/jobs", params={"limit": 2, "cursor": first["next"]}, headers=B).json()
    names = [j["job_id"] for j in first["items"] + rest["items"]]
    assert names == sorted(names)
    assert {"page-0", "page-1", "page-2"} <= set(names)
    assert len(names) == len(set(names))
    created(api, job_body("ticker", schedule={"every": "1s"}), B)
    eventually(lambda: len(api.get("/jobs/ticker/runs", headers=B).json()["items"]) >= 4, "4 runs")
    runs = api.get("/jobs/ticker/runs", params={"limit": 2}, headers=B).json()
    newest = runs["items"]
    older = api.get(
        "/jobs/ticker/runs", params={"limit": 2, "cursor": runs["next"]}, headers=B
    ).json()["items"]
    assert newest[-1]["scheduled_at"] > older[0]["scheduled_at"]
    cut = newest[-1]["scheduled_at"]
    before = api.get("/jobs/ticker/runs", params={"to": cut}, headers=B).json()["items"]
    assert before
    assert all(r["scheduled_at"] < cut for r in before)
    since = api.get("/jobs/ticker/runs", params={"from": cut}, headers=B).json()["items"]
    assert all(r["scheduled_at"] >= cut for r in since)
    assert api.post("/jobs/ticker/pause", headers=B).status_code in (200, 202)


def test_openapi_is_served(api: httpx.Client) -> None:
    spec = api.get("/openapi.json").json()
    for path in ("/jobs", "/jobs/{job_id}", "/jobs/{job_id}/runs", "/runs/{run_id}"):
        assert path in spec["paths"]


def test_the_job_reference_is_the_api_s_body_and_served_to_editors(api: httpx.Client) -> None:
    """Every field of a job, with its type, default and description, in the OpenAPI body
    of POST, PUT and PATCH /jobs (issue 55), and the job file's JSON Schema without a
    token, for `# yaml-language-server: $schema=`."""
    spec = api.get("/openapi.json").json()
    fields = set(job_schema()["properties"])
    for path, method in (("/jobs", "post"), ("/jobs/{job_id}", "put"), ("/jobs/{job_id}", "patch")):
        body = spec["paths"][path][method]["requestBody"]["content"]["application/json"]
        properties = body["schema"]["properties"]
        assert set(properties) == fields, (path, method)
        assert all(p.get("description") for p in properties.values())
    post = spec["paths"]["/jobs"]["post"]["requestBody"]["content"]["application/json"]
    assert post["schema"]["properties"]["timeout_s"]["default"] == 3600.0
    assert post["schema"]["required"] == ["job_id", "command"]
    put = spec["paths"]["/jobs/{job_id}"]["put"]["requestBody"]["content"]["application/json"]
    assert put["schema"]["required"] == ["command"]  # the path names the job
    patch = spec["paths"]["/jobs/{job_id}"]["patch"]["requestBody"]["content"]
    patched = patch["application/json"]["schema"]
    assert patched["required"] == []
    # A field may be null (removed), and none has a default a client would fill in.
    assert {"type": "null"} in patched["properties"]["retry"]["anyOf"]
    assert "default" not in str(patched["properties"]["timeout_s"])
    served = api.get("/schemas/job.json", headers={"Authorization": ""})
    assert served.status_code == 200
    assert served.json() == job_file_schema()


def test_metrics_count_requests_by_route_template(api: httpx.Client) -> None:
    """/metrics (no token: Prometheus scrapes it) counts requests by route template and
    status, never by the path itself (a job id in a label would be a series per job)."""
    api.get("/jobs/no-such-job-for-metrics")
    api.get("/jobs/another-missing-one")
    answer = api.get("/metrics", headers={"Authorization": ""})
    assert answer.status_code == 200
    text = answer.text
    assert 'route="/jobs/{job_id}"' in text
    assert "no-such-job-for-metrics" not in text
    found = [
        line
        for line in text.splitlines()
        if line.startswith("cronlog_api_requests_total{")
        and 'route="/jobs/{job_id}"' in line
        and 'status="404"' in line
    ]
    assert found
    assert float(found[0].rsplit(" ", 1)[1]) >= 2
    assert "cronlog_api_request_duration_seconds_bucket" in text
    assert "/metrics" not in api.get("/openapi.json").text


def test_a_worker_over_http_runs_a_job(api: httpx.Client) -> None:
    """A worker in 'another language': heartbeat, get the assignment, ack, get the grant,
    report started and finished; the run ends succeeded on that worker."""
    W = {"Authorization": "Bearer tok-w-0123456789ab"}
    created(
        api,
        job_body(
            "polyglot",
            schedule={"at": "2099-01-01T00:00:00Z"},
            resources={"cpu": 1, "labels": {"lang": "go"}},
        ),
        A,
    )
    assert api.post("/workers/w1/heartbeat", json={}, headers=A).status_code == 403
    assert api.post("/workers/w2/heartbeat", json={}, headers=W).status_code == 403
    bad = api.post("/workers/w1/heartbeat", json={"capacity": {"cpu": -1}}, headers=W)
    assert bad.status_code == 422
    running: list[dict[str, Any]] = []
    inbox: dict[str, list[dict[str, Any]]] = {"assignments": [], "grants": [], "kills": []}

    def beat() -> dict[str, list[dict[str, Any]]]:
        answer = api.post(
            "/workers/w1/heartbeat",
            json={
                "capacity": {"cpu": 2, "memory_mb": 1024},
                "labels": {"lang": "go"},
                "running": running,
            },
            headers=W,
        )
        assert answer.status_code == 200, answer.text
        for kind, items in answer.json().items():
            inbox[kind].extend(items)
        return inbox

    # The dispatcher knows this worker once it placed a run only this worker fits: a
    # probe's (asked again should one fail as unplaceable, decided before the worker's
    # first beat was read), cancelled once placed.
    created(
        api,
        job_body(
            "polyglot-probe",
            schedule={"at": "2099-01-01T00:00:00Z"},
            resources={"cpu": 1, "labels": {"lang": "go"}},
        ),
        A,
    )
    probes: list[str] = []

    def probe_placed() -> str | None:
        placed = {a["run_id"] for a in beat()["assignments"]}
        found = next((p for p in probes if p in placed), None)
        if found is None and (
            not probes or api.get(f"/runs/{probes[-1]}", headers=A).json().get("state") == "failed"
        ):
            key = {"Idempotency-Key": f"probe-{len(probes)}"}
            probes.append(
                api.post("/jobs/polyglot-probe/run-now", headers={**A, **key}).json()["run_id"]
            )
        return found

    probe = eventually(probe_placed, "a run only this worker fits placed on it")
    assert api.post(f"/runs/{probe}/cancel", headers=A).status_code == 202
    run_id = api.post("/jobs/polyglot/run-now", headers={**A, "Idempotency-Key": "go"}).json()[
        "run_id"
    ]

    def assigned_and_granted(what: str) -> dict[str, Any]:
        """Wait for the run's assignment, claim it (ack), wait for the granted reply."""
        assignment: dict[str, Any] = eventually(
            lambda: [a for a in beat()["assignments"] if a["run_id"] == run_id], what
        )[0]
        attempt = assignment["attempt"]
        if what == "the assignment":
            # A claim without the assignment's seal is refused by the ledger.
            bare = api.post(f"/runs/{run_id}/ack", json={"attempt": attempt}, headers=W)
            assert bare.status_code == 202
            refused = eventually(
                lambda: [g for g in beat()["grants"] if g["run_id"] == run_id], "a refusal"
            )[0]
            assert refused["granted"] is False
            assert "was not placed on" in refused["reason"]
        body = {"attempt": attempt, "placement": assignment["placement"]}
        ack = api.post(f"/runs/{run_id}/ack", json=body, headers=W)
        assert ack.status_code == 202
        grant = eventually(
            lambda: [g for g in beat()["grants"] if g["run_id"] == run_id and g["granted"]],
            f"{what}'s reply",
        )[0]
        assert grant["granted"] is True
        running.append({"run_id": run_id, "attempt": attempt})
        return assignment

    assignment = assigned_and_granted("the assignment")
    attempt = assignment["attempt"]
    assert assignment["command"] == ["echo", "hi"]
    beat()
    # Give it back before starting it (say, no room after all): the same attempt comes back
    # as a new assignment, and can be claimed again.
    inbox["assignments"].clear()
    inbox["grants"].clear()
    back = api.post(
        f"/runs/{run_id}/released", json={"attempt": attempt, "reason": "no room"}, headers=W
    )
    assert back.status_code == 202
    running.clear()
    assert assigned_and_granted("the re-assignment")["attempt"] == attempt
    assert (
        api.post(f"/runs/{run_id}/started", json={"attempt": attempt}, headers=W).status_code == 202
    )
    done = api.post(
        f"/runs/{run_id}/finished", json={"attempt": attempt, "exit_code": 0}, headers=W
    )
    assert done.status_code == 202
    running.clear()
    final = eventually(
        lambda: (r := api.get(f"/runs/{run_id}", headers=A).json())["state"] == "succeeded" and r,
        "the run to succeed",
    )
    assert final["worker_id"] == "w1"
    assert [t["state"] for t in final["transitions"]].count("running") == 1


def cli(topics: Settings, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", *args],
        env={**env_for(topics), **role_env(list(args))},  # the admin's, on a secured broker
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_cli_for_humans(api: httpx.Client, topics: Settings, tmp_path: Path) -> None:
    jobs_file = tmp_path / "jobs.yaml"
    jobs_file.write_text(
        "jobs:\n"
        "  - {job_id: cli-tick, schedule: {every: 2s}, command: [echo, tock]}\n"
        "  - job_id: cli-manual\n"
        "    schedule: {at: '2099-01-01T00:00:00Z'}\n"
        "    command: [sh, -c, 'echo manual; sleep 60']\n"
    )
    added = cli(topics, "jobs", "add", "-f", str(jobs_file), "--owner", "team-c")
    assert added.returncode == 0, added.stderr
    assert "cli-tick: registered" in added.stdout
    bad = cli(topics, "jobs", "add", '{"job_id": "cli-bad", "command": ["x"], "schedule": {}}')
    assert bad.returncode == 1
    assert "cli-bad: rejected" in bad.stderr

    listed = cli(topics, "jobs", "list", "--owner", "team-c")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:3] == ["JOB_ID", "OWNER", "SCHEDULE"]
    assert [r.split()[0] for r in rows] == ["cli-manual", "cli-tick"]
    as_json = orjson.loads(cli(topics, "jobs", "list", "--owner", "team-c", "--json").stdout)
    assert [j["job_id"] for j in as_json] == ["cli-manual", "cli-tick"]

    eventually(
        lambda: "succeeded" in cli(topics, "runs", "list", "--job", "cli-tick").stdout,
        "a succeeded cli-tick run",
    )
    runs = orjson.loads(
        cli(topics, "runs", "list", "--job", "cli-tick", "--state", "succeeded", "--json").stdout
    )
    shown = cli(topics, "runs", "show", runs[0]["run_id"])
    assert "succeeded" in shown.stdout
    assert "tock" in shown.stdout
    assert cli(topics, "runs", "logs", runs[0]["run_id"]).stdout == "tock\n"
    show_job = cli(topics, "jobs", "show", "cli-tick")
    assert "every 2s" in show_job.stdout
    paused = cli(topics, "jobs", "pause", "cli-tick")
    assert paused.returncode == 0
    assert "cli-tick: paused" in paused.stdout

    started = cli(topics, "jobs", "run-now", "cli-manual", "--request-id", "r1", "--json")
    run_id = orjson.loads(started.stdout)["run_id"]
    assert run_id == "cli-manual@manual:r1"
    eventually(
        lambda: "running" in cli(topics, "runs", "show", run_id).stdout, "the manual run to run"
    )
    assert cli(topics, "runs", "cancel", run_id).returncode == 0
    eventually(
        lambda: "cancelled" in cli(topics, "runs", "show", run_id).stdout.splitlines()[0],
        "the cancel",
    )
    missing = cli(topics, "jobs", "show", "no-such-job")
    assert missing.returncode == 1
    assert "not found" in missing.stderr


def test_hostile_requests_get_clear_client_errors(api: httpx.Client) -> None:
    """A non-ASCII token, a NUL in a path, a forged cursor: 4xx with a message, never 500."""
    odd = api.get("/jobs", headers={b"Authorization": "Bearer t\u00f6k".encode()})
    assert odd.status_code == 401, odd.text
    nul = api.get("/jobs/a%00b", headers=A)
    assert nul.status_code == 400, nul.text
    assert "invalid value" in nul.json()["error"]["message"]
    forged = base64.urlsafe_b64encode(orjson.dumps(["not a time", "x"])).decode()
    bad_cursor = api.get("/runs", params={"cursor": forged}, headers=A)
    assert bad_cursor.status_code == 400, bad_cursor.text
    assert api.get("/runs", params={"cursor": "%%%"}, headers=A).status_code == 400
    # Readiness names what is down, never the driver's words.
    assert set(api.get("/readyz").json().values()) <= {True, False, "ok", "unavailable"}


def test_a_flooding_token_gets_429_and_the_others_are_served(
    topics: Settings, tmp_path: Path
) -> None:
    port = free_port()
    limited = CronlogProcess(
        topics,
        "api-limited",
        tmp_path,
        ["api", "--port", str(port), "--loglevel", "warning"],
        extra_env={
            **TOKENS,
            "CRONLOG_API_RATE": "5",
            "CRONLOG_API_BURST": "10",
            "CRONLOG_API_TRUSTED_PROXIES": "127.0.0.2",
        },
    ).start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            eventually(lambda: _answers(client), "the limited API")
            answers = [client.get("/jobs", headers=A) for _ in range(40)]
            codes = [a.status_code for a in answers]
            other = client.get("/jobs", headers=B)
            health = client.get("/healthz")
        # Anonymous callers behind a TLS proxy at 127.0.0.2, named as trusted: one
        # client's junk does not lock the sign-in page for another.
        proxy = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30, transport=proxy) as via:
            junk = {"X-Forwarded-For": "203.0.113.5"}
            flood = [via.get("/ui/login", headers=junk).status_code for _ in range(40)]
            neighbour = via.get("/ui/login", headers={"X-Forwarded-For": "203.0.113.6"})
        refused = [a for a in answers if a.status_code == 429]
        assert flood.count(429) >= 20, flood
        assert neighbour.status_code == 200
        assert codes[:10] == [200] * 10  # the burst
        assert len(refused) >= 20, codes  # 40 in well under 4 s at 5/s
        assert int(refused[0].headers["Retry-After"]) >= 1
        assert "rate limit" in refused[0].json()["error"]["message"]
        assert other.status_code == 200  # another token is not slowed
        assert health.status_code == 200  # probes are not limited
    finally:
        limited.stop()


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_the_dashboard_refuses_forged_forms_and_confines_browsers(api: httpx.Client) -> None:
    """Login and logout need a form this dashboard made (a cross-site POST carries no
    SameSite=strict cookie); every answer forbids framing and foreign scripts; behind a
    trusted TLS proxy the session cookie is Secure."""
    base = str(api.base_url)
    token = "tok-a-0123456789ab"

    def login_value(html: str) -> str:
        found = re.search(r'name="login" value="([^"]+)"', html)
        assert found, html
        return found.group(1)

    with httpx.Client(base_url=base, timeout=30) as browser:
        form = browser.get("/ui/login")
        assert form.status_code == 200
        assert "frame-ancestors 'none'" in form.headers["content-security-policy"]
        assert "script-src 'self'" in form.headers["content-security-policy"]
        assert form.headers["x-frame-options"] == "DENY"
        assert api.get("/jobs", headers=A).headers["x-frame-options"] == "DENY"
        value = login_value(form.text)

        # Another site's form: no sign-in cookie of ours, so no session.
        with httpx.Client(base_url=base, timeout=30) as elsewhere:
            forged = elsewhere.post("/ui/login", data={"token": token, "login": value})
            assert forged.status_code == 403
            assert "cronlog_token" not in forged.headers.get("set-cookie", "")

        # This dashboard's form, through a TLS proxy (127.0.0.1 is trusted by default).
        signed = browser.post(
            "/ui/login",
            data={"token": token, "login": value, "next": "/ui"},
            headers={"X-Forwarded-Proto": "https"},
        )
        assert signed.status_code == 303, signed.text
        session = next(
            c for c in signed.headers.get_list("set-cookie") if c.startswith("cronlog_token=")
        )
        assert "Secure" in session
        assert "HttpOnly" in session
        assert "SameSite=strict" in session
        browser.cookies.set("cronlog_token", token, path="/ui")

        # Logout without the page's form token is refused; with it, done.
        refused = browser.post("/ui/logout", data={})
        assert refused.status_code == 403
        page = browser.get("/ui")
        assert page.status_code == 200
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert csrf
        out = browser.post("/ui/logout", data={"csrf": csrf.group(1)})
        assert out.status_code == 303
        assert 'cronlog_token=""' in out.headers.get("set-cookie", "")


def test_a_dependency_cycle_is_refused_and_an_unknown_upstream_said(
    api: httpx.Client, topics: Settings
) -> None:
    """The demo's chain turned back on itself (issue 35): extract <- transform <- load,
    then extract made to depend on load: 422 naming the cycle, nothing changed. An
    upstream nobody registered is accepted with a warning saying so."""
    created(api, job_body("cy-extract"), A)
    created(api, job_body("cy-transform", schedule=None, depends_on=["cy-extract"]), A)
    created(api, job_body("cy-load", schedule=None, depends_on=["cy-transform"]), A)
    closing = api.patch(
        "/jobs/cy-extract", json={"depends_on": ["cy-load"], "schedule": None}, headers=A
    )
    assert closing.status_code == 422, closing.text
    error = closing.json()["error"]
    assert error["field"] == "depends_on"
    assert "cy-extract -> cy-load -> cy-transform -> cy-extract" in error["message"]
    assert api.get("/jobs/cy-extract", headers=A).json()["spec"]["depends_on"] == []
    assert api.get("/jobs/cy-extract", headers=A).json()["cycle"] == []
    # The same change written to `commands` past the API: the ledger refuses it (its
    # probe comes back round the cycle) and the job says so, naming the cycle.
    closing_body = job_body("cy-extract", schedule=None, depends_on=["cy-load"])
    send_commands(topics, [{"type": "job.upsert", "owner": "team-a", **closing_body}])
    refused = ["cy-extract", "cy-load", "cy-transform", "cy-extract"]
    eventually(
        lambda: api.get("/jobs/cy-extract", headers=A).json()["cycle"] == refused,
        "the ledger to refuse the cycle",
    )
    signed_in = {"Cookie": "cronlog_token=" + A["Authorization"].removeprefix("Bearer ")}
    page = api.get("/ui/jobs/cy-extract", headers=signed_in)
    assert page.status_code == 200, page.text
    assert "depends_on closes the dependency cycle cy-extract → cy-load" in page.text
    # Changed again without the cycle: accepted, the refusal gone.
    back = api.patch(
        "/jobs/cy-extract", json={"depends_on": [], "schedule": {"every": "2s"}}, headers=A
    )
    assert back.status_code in (200, 202), back.text
    eventually(
        lambda: api.get("/jobs/cy-extract", headers=A).json()["cycle"] == [],
        "the refusal to be lifted by the change",
    )
    # An upstream not registered (a typo waits for ever) is refused, naming it, unless
    # the caller says it will be registered (issue 55); then it is a warning.
    waits = job_body("cy-waits", schedule=None, depends_on=["cy-ghost", "cy-extract"])
    typo = api.post("/jobs", json=waits, headers=A)
    assert typo.status_code == 422, typo.text
    assert typo.json()["error"]["field"] == "depends_on"
    assert "'cy-ghost', not registered" in typo.json()["error"]["message"]
    assert "cy-extract" not in typo.json()["error"]["message"]
    ghost = api.post("/jobs", json=waits, headers=A, params={"allow_missing_upstreams": "true"})
    assert ghost.status_code in (201, 202), ghost.text
    assert any("'cy-ghost', which is not registered" in w for w in ghost.json()["warnings"])
    # A change of another field is not refused for the upstream it already named.
    later = api.patch("/jobs/cy-waits", json={"jitter_s": 5}, headers=A)
    assert later.status_code in (200, 202), later.text


def _backfilled(api: httpx.Client, job_id: str) -> int:
    total: int = 0
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        page = api.get(f"/jobs/{job_id}/runs", params=params, headers=A).json()
        total += sum(run["trigger"] == "backfill" for run in page["items"])
        cursor = page["next"]
        if not cursor:
            return total


def test_a_backfill_through_the_api_creates_its_whole_range_each_once(api: httpx.Client) -> None:
    """A backfill of 121 fire times creates 121 runs, each once. They are paced (a job
    holds 10 live backfill runs, the next created as those end): no worker has the
    memory asked, so each fails at dispatch (`DispatchFailed`), which makes room for the
    next, a dozen slices. A range past what one decision looks at (1,000 fire times)
    continues on the job's log: tests/unit/test_ledger_edges.py
    (`test_a_backfill_past_one_transaction_carries_on_to_the_end_of_its_range`) and
    tests/unit/test_backfill_pacing.py play that in the pure ledger. A range holding more
    than one backfill may create is refused with its size."""
    body = job_body("filler", schedule={"every": "1s"}, resources={"memory_mb": 4_000_000})
    job = created(api, body, A)
    registered = datetime.fromisoformat(job["created_at"])
    start = registered - timedelta(seconds=120)
    answer = api.post(
        "/jobs/filler/backfill",
        json={"from": start.isoformat(), "to": registered.isoformat()},
        headers=A,
    )
    assert answer.status_code == 202, answer.text
    expected = 121 if registered.microsecond == 0 else 120
    assert answer.json()["runs_at_most"] == expected
    eventually(
        lambda: _backfilled(api, "filler") >= expected, "every backfilled run", timeout_s=300
    )
    assert _backfilled(api, "filler") == expected  # no run twice
    too_big = api.post(
        "/jobs/filler/backfill",
        json={"from": (registered - timedelta(days=2)).isoformat(), "to": start.isoformat()},
        headers=A,
    )
    assert too_big.status_code == 422, too_big.text
    assert "more than 100000 fire times" in too_big.json()["error"]["message"]
    assert api.delete("/jobs/filler", headers=A).status_code in (200, 202)


def test_a_team_added_with_one_command_calls_the_api_without_a_restart(
    api: httpx.Client,
) -> None:
    """Issue 55: `cronlog tokens create --owner payments` while the API runs; the token,
    printed once and kept hashed, is the payments team's a second later (`cronlog
    whoami` says so), `list` never shows it, and `revoke` ends it, again without a
    restart."""
    tokens_file: Path = api.tokens_file  # type: ignore[attr-defined]
    env = {"CRONLOG_API_TOKENS_FILE": str(tokens_file)}
    made = cli_with_only("tokens", "create", "--owner", "payments", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.splitlines()[1]
    token_id = made.stdout.split()[1]
    assert token not in tokens_file.read_text()  # kept as its hash only
    assert tokens_file.stat().st_mode & 0o777 == 0o600
    bearer = {"Authorization": f"Bearer {token}"}
    eventually(lambda: api.get("/whoami", headers=bearer).status_code == 200, "the new token")
    assert api.get("/whoami", headers=bearer).json() == {"kind": "owner", "name": "payments"}
    job = job_body("pay-nightly", schedule="manual")
    assert api.post("/jobs", json=job, headers=bearer).status_code in (201, 202)
    assert api.get("/jobs/pay-nightly", headers=A).status_code == 404  # payments' alone
    me = cli_with_only("whoami", env={"CRONLOG_API_URL": str(api.base_url), "CRONLOG_TOKEN": token})
    assert me.returncode == 0, me.stderr
    assert me.stdout.startswith("owner payments at ")
    listed = cli_with_only("tokens", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert token_id in listed.stdout
    assert "payments" in listed.stdout
    assert token not in listed.stdout
    revoked = cli_with_only("tokens", "revoke", token_id, env=env)
    assert revoked.returncode == 0, revoked.stderr
    eventually(lambda: api.get("/whoami", headers=bearer).status_code == 401, "the revoke")
    assert api.get("/whoami", headers=A).json() == {"kind": "owner", "name": "team-a"}


def test_a_webhook_the_notifier_would_refuse_is_refused_at_registration(
    api: httpx.Client,
) -> None:
    """Issue 55: a loopback webhook was accepted, then dead-lettered at every failure and
    seen only in the notifier's log. An address the notifier's guard refuses, written
    in the URL (or `localhost`), is refused now with the guard's reason; a host name is
    the notifier's to judge when it resolves it."""
    for url in ("http://127.0.0.1:8080/hook", "http://localhost/x", "http://[::1]/x",
                "http://169.254.169.254/latest", "http://10.1.2.3/x"):  # fmt: skip
        hooked = job_body("hooked", notify={"url": url, "on": ["failed"]})
        refused = api.post("/jobs", json=hooked, headers=A)
        assert refused.status_code == 422, (url, refused.text)
        error = refused.json()["error"]
        assert error["field"] == "notify.url"
        assert "webhooks may reach public addresses only" in error["message"]
    public = job_body("hooked", notify={"url": "https://hooks.example.com/x", "on": ["failed"]})
    assert api.post("/jobs", json=public, headers=A).status_code in (201, 202)
