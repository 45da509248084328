"""Per-owner quotas through the API (issue 53 item 12): past its `jobs`,
`backfill_runs` or `backfill_jobs` quota an owner is refused with 429, Retry-After and a
message naming the quota, while another owner is not; on real processes (node,
projector, API)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from streams.settings import Settings
from tests.support.nodes import CronlogProcess, Node, ProjectorProc, stop_all
from tests.support.ports import free_port
from tests.support.waiting import eventually

LIMITED = "tok-quota-limited-0123456789"
OTHER = "tok-quota-other-01234567890"


@pytest.fixture(scope="module")
def api(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    logs: Path = tmp_path_factory.mktemp("quotas")
    port = free_port()
    env = {
        "CRONLOG_API_TOKENS": f"{LIMITED}=limited,{OTHER}=other",
        "CRONLOG_API_ADMIN_TOKENS": "tok-quota-admin-0123456789",
        "CRONLOG_API_RATE": "0",
        "CRONLOG_OWNER_QUOTAS": "jobs=100;limited:jobs=2,backfill_runs=30,backfill_jobs=1",
    }
    procs = [
        Node(topics, "quota-n1", logs).start(),
        ProjectorProc(topics, logs / "projector.log").start(),
        CronlogProcess(
            topics, "quota-api", logs, ["api", "--port", str(port), "--loglevel", "warning"], env
        ).start(),
    ]
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def ready() -> bool:
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(ready, "the API to be ready", timeout_s=60)
        yield client
    finally:
        client.close()
        stop_all(procs)


def _job(job_id: str) -> dict[str, object]:
    return {"job_id": job_id, "schedule": {"cron": "0 * * * *"}, "command": ["true"]}


def test_an_owner_past_its_jobs_quota_is_refused_naming_it(api: httpx.Client) -> None:
    limited = {"Authorization": f"Bearer {LIMITED}"}
    for n in range(2):
        made = api.post("/jobs", json=_job(f"quota-l{n}"), headers=limited)
        assert made.status_code in (201, 202), made.text

    def refused() -> httpx.Response | None:
        answer = api.post("/jobs", json=_job("quota-l2"), headers=limited)
        return answer if answer.status_code == 429 else None

    answer = eventually(refused, "the third job refused (the projection shows two)")
    assert "quota jobs: owner 'limited' has 2 jobs registered, at most 2" in answer.text
    assert int(answer.headers["retry-after"]) > 0
    # another owner is not limited by it
    other = api.post("/jobs", json=_job("quota-o0"), headers={"Authorization": f"Bearer {OTHER}"})
    assert other.status_code in (201, 202), other.text


def test_a_backfill_past_the_owners_backfill_quota_is_refused(api: httpx.Client) -> None:
    limited = {"Authorization": f"Bearer {LIMITED}"}
    eventually(
        lambda: api.get("/jobs/quota-l0", headers=limited).status_code == 200,
        "the job projected",
    )
    small = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T19:00:00Z"}  # 20 runs
    ok = api.post("/jobs/quota-l0/backfill", json=small, headers=limited)
    assert ok.status_code == 202, ok.text
    assert ok.json()["runs_at_most"] == 20
    big = {"from": "2026-02-01T00:00:00Z", "to": "2026-02-02T23:00:00Z"}  # 48 runs
    refused = api.post("/jobs/quota-l0/backfill", json=big, headers=limited)
    assert refused.status_code == 429, refused.text
    assert "quota backfill_runs: owner 'limited'" in refused.text
    assert "may create 48; at most 30" in refused.text
    assert int(refused.headers["retry-after"]) > 0


def test_a_backfill_of_another_job_past_the_backfill_jobs_quota_is_refused(
    api: httpx.Client,
) -> None:
    """Run after the test above: quota-l0 has a backfill pending (no worker runs it), so
    a backfill of quota-l1 waits (one job backfilling at a time for this owner)."""
    limited = {"Authorization": f"Bearer {LIMITED}"}
    small = {"from": "2026-03-01T00:00:00Z", "to": "2026-03-01T01:00:00Z"}

    def refused() -> httpx.Response | None:
        answer = api.post("/jobs/quota-l1/backfill", json=small, headers=limited)
        assert answer.status_code in (202, 429), answer.text
        return answer if answer.status_code == 429 else None

    answer = eventually(refused, "the second job's backfill refused (the first projected)")
    assert "quota backfill_jobs: owner 'limited' has 1 other jobs" in answer.text
    assert int(answer.headers["retry-after"]) > 0
