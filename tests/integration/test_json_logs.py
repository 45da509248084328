"""`--log-format json` on real processes: a scheduler node (with its ledger process and
Faust's ingress) and a worker write nothing but JSON objects, one per line."""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson
import pytest

from streams.settings import Settings
from tests.support.nodes import CronlogProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration


def lines_of(path: Path) -> list[str]:
    return [line for line in path.read_text(errors="replace").splitlines() if line.strip()]


def test_a_node_and_a_worker_log_one_json_object_per_line(topics: Settings, tmp_path: Path) -> None:
    node = CronlogProcess(
        topics,
        "json-node",
        tmp_path,
        ["scheduler", "--node-id", "json-node", "--log-format", "json"],
    )
    worker = CronlogProcess(
        topics,
        "json-worker",
        tmp_path,
        ["worker", "--id", "json-w", "--executor", "noop", "--cpu", "1"],
        # The format from the environment, this time.
        extra_env={"CRONLOG_LOG_FORMAT": "json", "CRONLOG_STATE_DIR": str(tmp_path / "state")},
    )
    node.start()
    worker.start()
    try:

        def components() -> set[str]:
            seen = set()
            for line in lines_of(node.log) + lines_of(worker.log):
                with contextlib.suppress(orjson.JSONDecodeError):
                    seen.add(orjson.loads(line).get("component"))
            return seen

        eventually(
            lambda: {"scheduler", "ledger", "worker"} <= components(),
            "log lines from the node, its ledger and the worker",
            90,
        )
        ledger_owns = [
            orjson.loads(line) for line in lines_of(node.log) if "owns job-log partitions" in line
        ]
        assert ledger_owns, "the ledger's takeover line"
        assert ledger_owns[0]["component"] == "ledger"
        assert ledger_owns[0]["instance"] == "json-node"
    finally:
        node.stop()
        worker.stop()
    for log in (node.log, worker.log):
        for line in lines_of(log):
            fields = orjson.loads(line)  # every line, librdkafka's and Faust's included
            assert isinstance(fields, dict)
            assert {"ts", "level", "logger", "component", "message"} <= set(fields), line
