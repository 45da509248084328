"""The API refuses (422) what would make a command too large as written (issue 53 item
1, `params.written`): a registration whose defaults already do, and a run-now or backfill
whose values do; the same job with small values is accepted and its run-now dispatched.
Before, each of these was accepted and became a dispatch request of megabytes."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from streams.settings import Settings
from tests.support.nodes import CronlogProcess, Node, ProjectorProc, stop_all
from tests.support.ports import free_port
from tests.support.waiting import eventually

TOKENS = {
    "CRONLOG_API_TOKENS": "tok-a-0123456789ab=team-a",
    "CRONLOG_API_ADMIN_TOKENS": "tok-admin-0123456789ab",
}
A = {"Authorization": "Bearer tok-a-0123456789ab"}
REPEATED = "{v}" * 6800  # 20 KB of `{v}`: a 1 KiB value makes the argument 7 MB
KIB = "b" * 1024


@pytest.fixture(scope="module")
def api(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    logs: Path = tmp_path_factory.mktemp("api-written")
    port = free_port()
    procs: list[CronlogProcess] = [
        Node(topics, "written-n1", logs),
        ProjectorProc(topics, logs / "projector.log"),
        CronlogProcess(
            topics,
            "api",
            logs,
            ["api", "--port", str(port), "--loglevel", "warning"],
            extra_env=TOKENS,
        ),
    ]
    for proc in procs:
        proc.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

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


def body(job_id: str, default: str) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "schedule": {"every": "1h"},
        "command": ["echo", REPEATED],
        "params": {"v": {"type": "string", "default": default}},
        "params_in_command": True,
    }


def _message(answer: httpx.Response) -> str:
    return str(answer.json()["error"]["message"])


def test_a_registration_whose_defaults_are_too_large_as_written_is_a_422(
    api: httpx.Client,
) -> None:
    answer = api.post("/jobs", json=body("too-big", KIB), headers=A)
    assert answer.status_code == 422, answer.text
    assert "with the defaults" in _message(answer)
    assert "command[1]" in _message(answer)


def test_run_now_and_backfill_values_too_large_as_written_are_a_422(api: httpx.Client) -> None:
    created = api.post("/jobs", json=body("repeats", "a"), headers=A)
    assert created.status_code in (201, 202), created.text
    job = eventually(
        lambda: (r := api.get("/jobs/repeats", headers=A)).status_code == 200 and r.json(),
        "the job in the projection",
    )
    answer = api.post("/jobs/repeats/run-now", json={"params": {"v": KIB}}, headers=A)
    assert answer.status_code == 422, answer.text
    assert "command[1]" in _message(answer)
    registered = datetime.fromisoformat(job["created_at"])
    backfill = {
        "from": (registered - timedelta(hours=3)).isoformat(),
        "to": registered.isoformat(),
        "params": {"v": KIB},
    }
    answer = api.post("/jobs/repeats/backfill", json=backfill, headers=A)
    assert answer.status_code == 422, answer.text
    assert "command[1]" in _message(answer)
    # Small values: accepted, and the run made (its argument 6,800 characters).
    small = api.post("/jobs/repeats/run-now", json={"params": {"v": "c"}}, headers=A)
    assert small.status_code == 202, small.text
    run_id = small.json()["run_id"]
    eventually(
        lambda: api.get(f"/runs/{run_id}", headers=A).json().get("state") == "due",
        "the small run-now due (dispatched; no worker here)",
    )
