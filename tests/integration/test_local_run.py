"""`cronlog run` as a newcomer meets it: every component under one supervisor, the demo
jobs registered and running, visible in SQL and through the API; a crashed component is
restarted and reported; Ctrl-C stops everything."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import yaml

from streams.settings import Settings
from tests.support.nodes import ROOT, env_for
from tests.support.ports import free_port
from tests.support.waiting import eventually

CLI = [sys.executable, "-m", "connectors.cli"]
DEMO = {
    "demo-cron",
    "demo-every-10s",
    "demo-extract",
    "demo-transform",
    "demo-load",
    "demo-flaky",
}


def sql(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query).fetchall()


def test_cronlog_run_brings_up_everything(topics: Settings, tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "run.out"
    env = {**env_for(topics), "CRONLOG_STATE_DIR": str(tmp_path / "state")}
    with open(out, "wb") as sink:
        proc = subprocess.Popen(
            [*CLI, "run", "--no-stack", "--api-port", str(port), "--loglevel", "warning"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    pids: dict[str, int] = {}
    try:
        eventually(lambda: "registered 6 demo jobs" in out.read_text(), "the demo", 120)
        pids = {
            name: int(pid)
            for name, pid in re.findall(r"cronlog: (.+?) started \(pid (\d+)\)", out.read_text())
        }
        assert set(pids) == {
            "scheduler",
            "worker local-1",
            "worker local-2",
            "projector",
            "notifier",
            "api",
        }
        url = topics.database_url
        eventually(
            lambda: (
                {r[0] for r in sql(url, "SELECT job_id FROM jobs WHERE owner = 'demo'")} == DEMO
            ),
            "the demo jobs in SQL",
        )

        def finished() -> set[tuple[str, str]]:
            rows = sql(
                url,
                "SELECT job_id, state FROM runs WHERE state IN ('succeeded', 'failed')"
                " AND (job_id <> 'demo-flaky' OR attempt = 3)",
            )
            return {(job, state) for job, state in rows}

        # Every demo job runs: the interval job and the whole chain succeed, the flaky
        # job fails after its three attempts. The flaky job fires every 30 s.
        eventually(
            lambda: (
                {
                    ("demo-every-10s", "succeeded"),
                    ("demo-load", "succeeded"),
                    ("demo-flaky", "failed"),
                }
                <= finished()
            ),
            "the demo's runs",
            150,
        )
        tokens = yaml.safe_load((tmp_path / "state" / "api-tokens.yaml").read_text())
        owner_token = next(iter(tokens["owners"]))
        answer = httpx.get(
            f"http://127.0.0.1:{port}/jobs",
            headers={"Authorization": f"Bearer {owner_token}"},
            timeout=30,
        )
        assert answer.status_code == 200
        assert {j["job_id"] for j in answer.json()["items"]} == DEMO

        os.kill(pids["projector"], signal.SIGKILL)
        eventually(
            lambda: (
                "projector exited with status -9" in out.read_text()
                and "projector restarted (restart 1)" in out.read_text()
            ),
            "the projector's restart",
        )
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(60)
    assert code == 0, out.read_text()[-3000:]
    assert "stopped" in out.read_text()
    for name, pid in pids.items():
        if name != "projector":  # the first projector was killed above
            assert not Path(f"/proc/{pid}").exists() or _zombie(pid), name


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True
