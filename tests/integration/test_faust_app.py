"""A user's Faust app (faust-streaming, the design's stream framework) reads cronlog's
run-events with cronlog's codec (connectors/faust_codec.py) and gets typed records: the
README's example, run as a real `faust worker` on the real broker.

Faust lives in an environment of its own, as a user's app would (faust-streaming pins
croniter below 6, which cronlog needs): `.state/faust-venv`, made once by this test with
faust-streaming, aiokafka[lz4], fastavro and orjson, and cronlog's source on its path
(what `pip install --no-deps cronlog` gives)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

from confluent_kafka import Producer

from schemas.codec import RUN_EVENTS
from schemas.records import JobEvent, RunEvent, RunStateName
from streams.kafka import producer_config
from streams.settings import Settings
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".state" / "faust-venv"
PACKAGES = [
    "faust-streaming==0.15.3",
    "aiokafka[lz4]>=0.14,<0.15",
    "fastavro>=1.9,<2",
    "orjson>=3.10,<4",
]


def faust_python() -> Path:
    """The Faust environment's python, made (idempotently) on first use."""
    python = VENV / "bin" / "python"
    ready = VENV / ".ready"
    if not ready.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", *PACKAGES], check=True, timeout=600
        )
        ready.write_text(" ".join(PACKAGES))
    return python


def test_a_faust_agent_receives_cronlogs_events_typed(topics: Settings, tmp_path: Path) -> None:
    out = tmp_path / "received.txt"
    out.touch()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "PYTHONPATH": str(ROOT),
        "FAUST_APP_ID": f"faust-test-{uuid.uuid4().hex[:8]}",
        "CRONLOG_KAFKA": topics.kafka,
        "FAUST_TOPIC": topics.topic("run-events"),
        "FAUST_OUT": str(out),
    }
    python = faust_python()
    log = (tmp_path / "faust.log").open("w")
    worker = subprocess.Popen(
        [str(python), "-m", "faust", "-A", "tests.support.faust_app", "worker", "-l", "warn"],
        env=env,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        producer = Producer(producer_config(topics))

        def run_event(seq: int, state: RunStateName, reason: str) -> RunEvent:
            return RunEvent(
                f"ff-job@x#{seq}", "ff-job", "ff-job@x", 1_000, "schedule", 1, state,
                1_000 + seq, "w", reason,
            )  # fmt: skip

        sent: list[RunEvent | JobEvent] = [
            JobEvent("ff-job#job#1", "ff-job", "upserted", 1_000, None),
            run_event(1, "due", ""),
            run_event(2, "failed", "exit 1"),
        ]

        def received() -> bool:
            assert worker.poll() is None, (tmp_path / "faust.log").read_text()[-2000:]
            # Sent again until the app's group has its partitions (it reads from the end).
            for event in sent:
                value = RUN_EVENTS.encode(event)
                producer.produce(topics.topic("run-events"), key=b"ff-job", value=value)
            producer.flush(10)
            lines = out.read_text().splitlines()
            return {"JobEvent ff-job upserted", "RunEvent ff-job ff-job@x failed"} <= set(lines)

        eventually(received, "the Faust agent to receive typed events", timeout_s=120)
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
