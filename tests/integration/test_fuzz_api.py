"""Every route of the REST API fuzzed from its own OpenAPI document (schemathesis:
coverage, fuzzing and stateful phases), against a real `cronlog api` with a scheduler
node and the projector behind it: no request gets a 5xx, and the API still answers.

`CRONLOG_FUZZ_API_N` examples per operation: 25 in `make test`, more in `make fuzz`. The
rate limit is off for this API (a 429 is not a server error, but it would stop the
requests from reaching the routes); the limit itself is tested in test_api.py.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from streams.settings import Settings
from tests.support.nodes import CronlogProcess, Node, ProjectorProc, stop_all
from tests.support.ports import free_port
from tests.support.waiting import eventually

N = int(os.environ.get("CRONLOG_FUZZ_API_N", "25"))
OWNER = "tok-fuzz-0123456789ab"
ENV = {
    "CRONLOG_API_TOKENS": f"{OWNER}=team-fuzz",
    "CRONLOG_API_ADMIN_TOKENS": "tok-fuzz-admin-0123456789",
    "CRONLOG_WORKER_TOKENS": "tok-fuzz-w-0123456789ab=w1",
    "CRONLOG_API_RATE": "0",
}


@pytest.fixture(scope="module")
def api(topics: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    logs: Path = tmp_path_factory.mktemp("fuzz-api")
    port = free_port()
    procs: list[CronlogProcess] = [
        Node(topics, "fuzz-n1", logs),
        ProjectorProc(topics, logs / "projector.log"),
        CronlogProcess(
            topics, "api", logs, ["api", "--port", str(port), "--loglevel", "warning"], ENV
        ),
    ]
    for proc in procs:
        proc.start()
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)

    def ready() -> bool:
        try:
            return client.get("/readyz").status_code == 200
        except httpx.TransportError:
            return False

    try:
        eventually(ready, "the API to be ready")
        yield client
    finally:
        client.close()
        stop_all(reversed(procs))


def _fuzz(api: httpx.Client, token: str) -> tuple[int, int]:
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")),
            "run",
            f"{api.base_url}/openapi.json",
            "-H",
            f"Authorization: Bearer {token}",
            "--checks",
            "not_a_server_error",
            "--max-examples",
            str(N),
            "--generation-deterministic",
        ],
        capture_output=True,
        text=True,
        timeout=max(600, N),
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:]
    counts = re.search(r"(\d+) generated, (\d+) passed", done.stdout)
    assert counts is not None, done.stdout[-2000:]
    print(done.stdout[-1500:])
    return int(counts.group(1)), int(counts.group(2))


def test_fuzzing_every_route_finds_no_server_error(api: httpx.Client) -> None:
    made = api.post(
        "/jobs",
        json={"job_id": "fuzz-target", "schedule": {"every": "1h"}, "command": ["true"]},
        headers={"Authorization": f"Bearer {OWNER}"},
    )
    assert made.status_code in (201, 202), made.text
    generated, passed = _fuzz(api, OWNER)
    assert generated == passed > 200
    assert api.get("/readyz").status_code == 200  # and nothing broke it
