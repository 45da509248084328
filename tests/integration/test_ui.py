"""The web dashboard (/ui) in a real browser: Debian's headless Chromium driven by
Playwright against a scheduler node, a worker, the projector and `cronlog api`, all real
processes on the real stack. What a page shows is checked against the REST API's answers;
screenshots go to .state/screens/ for a person to look at."""

from __future__ import annotations

import shlex
import shutil
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from connectors.api.ui import COOKIE
from streams.settings import Settings
from tests.support.nodes import (
    CronlogProcess,
    Node,
    ProjectorProc,
    WorkerProc,
    send_commands,
    stop_all,
)
from tests.support.ports import free_port
from tests.support.waiting import eventually

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SCREENS = Path(__file__).resolve().parents[2] / ".state" / "screens"
TOKENS = {
    "CRONLOG_API_TOKENS": "tok-a-0123456789ab=team-a,tok-b-0123456789ab=team-b",
    "CRONLOG_API_ADMIN_TOKENS": "tok-adm-0123456789ab",
}
A = {"Authorization": "Bearer tok-a-0123456789ab"}
ADMIN = {"Authorization": "Bearer tok-adm-0123456789ab"}
LIVE = {"waiting", "due", "dispatched", "running", "retrying"}

if CHROMIUM is None:
    pytest.skip(
        "no chromium (apt-get install chromium; `cronlog stack up` installs it as root)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def stack(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    logs: Path = tmp_path_factory.mktemp("ui")
    port = free_port()
    procs: list[CronlogProcess] = [
        Node(topics, "ui-n1", logs),
        WorkerProc(topics, "ui-w1", logs, cpu=2, memory_mb=512),
        ProjectorProc(topics, logs / "projector.log"),
        CronlogProcess(
            topics, "api", logs, ["api", "--port", str(port), "--loglevel", "warning"], TOKENS
        ),
    ]
    for proc in procs:
        proc.start()
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            eventually(lambda: _ready(client), "the API to be ready")
        yield base
    finally:
        stop_all(reversed(procs))


def _ready(client: httpx.Client) -> bool:
    try:
        return client.get("/readyz").status_code == 200
    except httpx.TransportError:
        return False


def _job(job_id: str, owner: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {"type": "job.upsert", "job_id": job_id, "owner": owner, "command": command, **extra}


def _visible(api: httpx.Client, job_id: str) -> bool:
    return api.get(f"/jobs/{job_id}", headers=A).status_code == 200


def _runs(api: httpx.Client, job_id: str) -> list[dict[str, Any]]:
    answer = api.get(f"/jobs/{job_id}/runs", params={"limit": 100}, headers=A)
    assert answer.status_code == 200, answer.text
    return answer.json()["items"]  # type: ignore[no-any-return]


def _shot(page: Any, name: str) -> None:
    SCREENS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENS / f"{name}.png"), full_page=True)


def _sign_in(page: Any, base: str, token: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{base}/ui")
    assert page.url.startswith(f"{base}/ui/login")  # no token yet: the sign-in form
    page.fill("#token", token)
    page.click("#sign-in")
    page.wait_for_url(f"{base}/ui")


def test_the_dashboard_in_a_real_browser(topics: Settings, stack: str) -> None:
    send_commands(
        topics,
        [
            _job("ui-a", "team-a", ["echo", "hello from ui-a"], schedule={"every": "1s"}),
            _job("ui-fail", "team-a", ["false"], schedule={"every": "2s"}),
            _job("ui-down", "team-a", ["true"], schedule=None, depends_on=["ui-a"]),
            _job("ui-b", "team-b", ["true"], schedule={"every": "5s"}),
            # Two bad commands, one of each owner, for the dead-letter page.
            _job("ui-bad-a", "team-a", ["x"], schedule={"cron": "61 * * * *"}),
            _job("ui-bad-b", "team-b", ["x"], schedule={"cron": "not a cron"}),
        ],
    )
    api = httpx.Client(base_url=stack, timeout=30)
    for job_id in ("ui-a", "ui-fail", "ui-down"):
        eventually(partial(_visible, api, job_id), job_id)
    eventually(lambda: len(_runs(api, "ui-a")) >= 4, "runs of ui-a", timeout_s=60)
    eventually(lambda: any(r["state"] == "failed" for r in _runs(api, "ui-fail")), "a failed run")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        _sign_in(page, stack, "tok-a-0123456789ab")

        # The jobs of team-a, none of team-b's, each with its recent runs.
        shown = set(
            page.eval_on_selector_all("#jobs tr[data-job]", "rs => rs.map(r => r.dataset.job)")
        )
        assert shown == {"ui-a", "ui-fail", "ui-down"}
        assert page.locator('tr[data-job="ui-fail"] .cell.failed').count() >= 1
        _shot(page, "jobs")

        # The pause button of ui-a pauses it (the API agrees).
        page.goto(f"{stack}/ui/jobs/ui-a")
        page.click("button.pause")
        page.wait_for_selector("#flash")
        assert eventually(lambda: api.get("/jobs/ui-a", headers=A).json()["paused"], "paused")
        # Paused: no new firing; once the last runs end the grid must be the API's list.
        eventually(lambda: not {r["state"] for r in _runs(api, "ui-a")} & LIVE, "runs settled")
        page.goto(f"{stack}/ui/jobs/ui-a")
        assert page.locator("#paused").is_visible()
        assert page.locator('td a[href="/ui/jobs/ui-down"]').count() == 1  # its downstream
        cells = page.eval_on_selector_all(
            "#grid .cell", "cs => cs.map(c => [c.dataset.run, c.dataset.state])"
        )
        runs = _runs(api, "ui-a")
        assert cells == [[r["run_id"], r["state"]] for r in reversed(runs)]
        # The histogram counts every started scheduled run of the grid.
        counts = page.eval_on_selector_all(
            "#lateness text.count", "ts => ts.map(t => +t.textContent)"
        )
        started = [r for r in runs if r["started_at"] and r["trigger"] != "manual"]
        assert len(counts) == 10
        assert sum(counts) == len(started) > 0
        # Finished runs say how long they took; the command is shown quoted as it runs.
        took = page.eval_on_selector_all("#runs td.duration", "ts => ts.map(t => t.textContent)")
        assert any(t.endswith(" s") for t in took), took
        assert page.inner_text("#command") == shlex.join(
            api.get("/jobs/ui-a", headers=A).json()["spec"]["command"]
        )
        _shot(page, "job")

        # A run: its transitions and its log, as the API has them.
        run_id = next(r["run_id"] for r in runs if r["state"] == "succeeded")
        detail = eventually(
            lambda: (d := api.get(f"/runs/{run_id}", headers=A).json())["log_tail"] and d,
            "the run's log",
        )
        page.goto(f"{stack}/ui/runs/{run_id}")
        assert page.locator("#transitions tr").count() == len(detail["transitions"]) + 1
        assert page.inner_text('#log pre[data-attempt="1"]').strip() == "hello from ui-a"
        words = page.eval_on_selector_all(
            "#transitions td:last-child", "ts => ts.map(t => t.textContent)"
        )
        assert not any("null" in w or "{" in w for w in words), words  # words, not raw JSON
        assert page.inner_text("#state") == "succeeded"
        # A finished run can be run again, not cancelled; the rerun is its next attempt.
        assert page.locator("button.cancel").is_disabled()
        page.click("button.rerun")
        page.wait_for_selector("#flash")
        eventually(
            lambda: api.get(f"/runs/{run_id}", headers=A).json()["attempt"] == 2, "the rerun"
        )
        # Run now from the job's page lands on the run it started.
        page.goto(f"{stack}/ui/jobs/ui-fail")
        page.click("button.run-now")
        page.wait_for_selector("#state")
        assert "/ui/runs/ui-fail%40manual%3A" in page.url
        _shot(page, "run")

        page.goto(f"{stack}/ui/workers")
        row = page.locator('tr[data-worker="ui-w1"]')
        assert row.count() == 1
        assert "alive" in row.inner_text()
        _shot(page, "workers")

        page.goto(f"{stack}/ui/dag")
        assert page.locator('[data-edge="ui-a->ui-down"]').count() == 1
        _shot(page, "dag")

        page.goto(f"{stack}/ui/dead-letters")
        letters = page.inner_text("#dead-letters")
        assert "ui-bad-a" in letters
        assert "ui-bad-b" not in letters
        _shot(page, "dead-letters")

        # Another owner sees none of team-a's jobs, and not ui-a by its address.
        _sign_in(page, stack, "tok-b-0123456789ab")
        shown = set(
            page.eval_on_selector_all("#jobs tr[data-job]", "rs => rs.map(r => r.dataset.job)")
        )
        assert shown == {"ui-b"}
        answer = page.goto(f"{stack}/ui/jobs/ui-a")
        assert answer is not None
        assert answer.status == 404
        assert "not found" in page.inner_text("#error")
        _shot(page, "other-owner")

        _sign_in(page, stack, "tok-adm-0123456789ab")
        page.goto(f"{stack}/ui/dead-letters")
        letters = page.inner_text("#dead-letters")
        assert "ui-bad-a" in letters
        assert "ui-bad-b" in letters
        browser.close()

    # A form without the dashboard's form token is refused, signed in or not.
    forged = api.post(
        "/ui/jobs/ui-a/resume", data={"back": "/ui"}, cookies={COOKIE: "tok-a-0123456789ab"}
    )
    assert forged.status_code == 403
    # Not resumed: a later change of ui-a, once shown, took the path a resume would have
    # (commands, job-log, run-events, the projection: one partition each, in order).
    later = api.patch("/jobs/ui-a", json={"priority": 7}, headers=A)
    assert later.status_code in (200, 202), later.text
    shown = eventually(
        lambda: (j := api.get("/jobs/ui-a", headers=A).json())["spec"]["priority"] == 7 and j,
        "the later change of ui-a",
    )
    assert shown["paused"] is True
    assert api.get("/ui", follow_redirects=False).status_code == 303  # no cookie: sign in
    api.close()
